// Package ruleset builds the nftables ruleset the proxier wants for a ClusterState.
// Build is a pure function of state and Config; it performs no I/O. The Ruleset it
// returns is plain data; proxier/changeset builds the same layout incrementally
// and reports what changed, for proxier/syncer to apply.
package ruleset

import (
	"iter"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// Chain is a chain and its rules, in order.
type Chain struct {
	knftables.Chain
	Rules []*knftables.Rule
}

// Ruleset is the desired content of one nftables table (one IP family).
type Ruleset struct {
	Family knftables.Family
	Table  string
	// Comment is the table's comment.
	Comment string

	Chains map[string]*Chain
	Sets   map[string]*knftables.Set
	Maps   map[string]*knftables.Map
	// Elements holds the elements of each set and map, by container name and then by
	// the nft text of the element's key (see ElementKey). Elements are stored by
	// value: a large table has millions, and a knftables.Element each (with its key
	// and value slices) would cost several times their text in memory and in the
	// garbage collector's work. knftables.Element is made only where an element
	// leaves the Ruleset (ElementObject).
	Elements map[string]map[string]Elem

	// A fragment (BuildService's) lists its elements in list instead: a Service's
	// are a few, and a few maps per Service, made and dropped by the hundred
	// thousand in a first build, would be most of its garbage.
	fragment bool
	list     []Listed
}

// Listed is an element with its set or map and its key, as a fragment lists it.
type Listed struct {
	Cont, Key string
	Elem      Elem
}

// newFragment returns an empty fragment: a Ruleset whose elements are listed.
func newFragment(family knftables.Family, table string) *Ruleset {
	r := New(family, table)
	r.fragment = true
	return r
}

// Listed returns the elements of r, one per set or map and key, in no particular
// order: the list of a fragment, or those of Elements for any other Ruleset.
func (r *Ruleset) Listed() []Listed {
	if r.fragment {
		return r.list
	}
	var out []Listed
	for c, es := range r.Elements {
		for k, e := range es {
			out = append(out, Listed{Cont: c, Key: k, Elem: e})
		}
	}
	return out
}

// LastOfEach returns the last element of list of each set or map and key, as
// adding them one by one to Elements would leave them; it reuses list.
func LastOfEach(list []Listed) []Listed {
	type id struct{ cont, key string }
	var last map[id]int
	if len(list) > lastOfEachScan {
		last = make(map[id]int, len(list))
		for i, x := range list {
			last[id{x.Cont, x.Key}] = i
		}
	}
	out := list[:0]
	for i, x := range list {
		if last != nil {
			if last[id{x.Cont, x.Key}] == i {
				out = append(out, x)
			}
			continue
		}
		// Most Services list a few elements, and seldom a key twice (an endpoint
		// of two of their ports in the hairpin set): a scan allocates nothing.
		later := false
		for _, y := range list[i+1:] {
			if y.Cont == x.Cont && y.Key == x.Key {
				later = true
				break
			}
		}
		if !later {
			out = append(out, x)
		}
	}
	clear(list[len(out):])
	return out
}

// lastOfEachScan is the longest list LastOfEach scans rather than maps.
const lastOfEachScan = 64

// Elem is an element of a set or map, stored under its key. Data is the nft text
// of a map element's value ("10.0.0.5 . 8080"), or the comment of a set element
// ("" for none): no map of this layout comments its elements, and no set has
// values, so one field holds either.
type Elem struct {
	Data string
}

// New returns an empty Ruleset for the given family and table name.
func New(family knftables.Family, table string) *Ruleset {
	return &Ruleset{
		Family:   family,
		Table:    table,
		Chains:   map[string]*Chain{},
		Sets:     map[string]*knftables.Set{},
		Maps:     map[string]*knftables.Map{},
		Elements: map[string]map[string]Elem{},
	}
}

// ElementKey is the identity of an element within its set or map: its key as nft
// writes it, the fields joined by " . ".
func ElementKey(e *knftables.Element) string { return JoinFields(e.Key) }

// JoinFields joins the fields of a concatenation (a key or a value) as nft writes
// them.
func JoinFields(fields []string) string {
	if len(fields) == 1 {
		return fields[0]
	}
	return strings.Join(fields, " . ")
}

// SplitFields appends the fields of text (a key or a value as JoinFields wrote it)
// to buf and returns it; a nil buf gets one of the right size.
func SplitFields(buf []string, text string) []string {
	if buf == nil {
		buf = make([]string, 0, strings.Count(text, " . ")+1)
	}
	for {
		i := strings.Index(text, " . ")
		if i < 0 {
			return append(buf, text)
		}
		buf = append(buf, text[:i])
		text = text[i+3:]
	}
}

// Container returns the name of the set or map an element belongs to.
func Container(e *knftables.Element) string {
	if e.Set != "" {
		return e.Set
	}
	return e.Map
}

// ElemOf returns the stored form of e, whose container is a map when isMap.
func ElemOf(e *knftables.Element, isMap bool) Elem {
	if isMap {
		return Elem{Data: JoinFields(e.Value)}
	}
	if e.Comment != nil {
		return Elem{Data: *e.Comment}
	}
	return Elem{}
}

// ToElement returns the element of container cont (a map when isMap) with the key
// text key, as knftables wants it, without family and table.
func ToElement(cont string, isMap bool, key string, e Elem) *knftables.Element {
	ke := &knftables.Element{}
	fillElement(ke, cont, isMap, key, e, nil)
	return ke
}

// fillElement sets the container, key, value and comment of ke as ToElement does,
// reusing ke's key and value slices. A set element's comment goes to *comment, or
// to a new string when comment is nil.
func fillElement(ke *knftables.Element, cont string, isMap bool, key string, e Elem, comment *string) {
	ke.Key = SplitFields(ke.Key[:0], key)
	if isMap {
		ke.Map, ke.Set, ke.Comment = cont, "", nil
		ke.Value = SplitFields(ke.Value[:0], e.Data)
		return
	}
	ke.Set, ke.Map, ke.Value, ke.Comment = cont, "", nil, nil
	if e.Data != "" {
		if comment == nil {
			comment = new(string)
		}
		*comment = e.Data
		ke.Comment = comment
	}
}

// KnftElements returns the elements of r's set or map cont as knftables.Elements,
// in no particular order, for a writer that encodes each as it comes. The element
// yielded is the same one each time, filled anew: it is valid only until the next.
func (r *Ruleset) KnftElements(cont string) iter.Seq[*knftables.Element] {
	isMap := r.IsMap(cont)
	return func(yield func(*knftables.Element) bool) {
		var key, value [4]string
		ke := knftables.Element{Key: key[:0], Value: value[:0]}
		var comment string
		for k, e := range r.Elements[cont] {
			fillElement(&ke, cont, isMap, k, e, &comment)
			if !yield(&ke) {
				return
			}
		}
	}
}

// AddChain adds an empty chain (or returns the existing one of that name).
func (r *Ruleset) AddChain(c knftables.Chain) *Chain {
	if ch, ok := r.Chains[c.Name]; ok {
		return ch
	}
	ch := &Chain{Chain: c}
	r.Chains[c.Name] = ch
	return ch
}

// firstRule is the first rule of a chain and the array that lists it, allocated
// together: most chains have one rule.
type firstRule struct {
	list [1]*knftables.Rule
	rule knftables.Rule
}

// AddRule appends a rule to the named chain, which must exist.
func (r *Ruleset) AddRule(chain, rule string, comment ...string) {
	ch := r.Chains[chain]
	var kr *knftables.Rule
	if cap(ch.Rules) == 0 {
		fr := &firstRule{rule: knftables.Rule{Chain: chain, Rule: rule}}
		kr = &fr.rule
		fr.list[0] = kr
		ch.Rules = fr.list[:]
	} else {
		kr = &knftables.Rule{Chain: chain, Rule: rule}
		ch.Rules = append(ch.Rules, kr)
	}
	if len(comment) > 0 && comment[0] != "" {
		kr.Comment = knftables.PtrTo(comment[0])
	}
}

// AddSet adds a set definition.
func (r *Ruleset) AddSet(s *knftables.Set) { r.Sets[s.Name] = s }

// AddMap adds a map definition.
func (r *Ruleset) AddMap(m *knftables.Map) { r.Maps[m.Name] = m }

// AddElement adds (or replaces) the element of set or map cont with the key text
// key.
func (r *Ruleset) AddElement(cont, key string, e Elem) {
	if r.fragment {
		r.list = append(r.list, Listed{Cont: cont, Key: key, Elem: e})
		return
	}
	es := r.Elements[cont]
	if es == nil {
		es = map[string]Elem{}
		r.Elements[cont] = es
	}
	es[key] = e
}

// AddKnftElement adds (or replaces) e, an element of a set or map of r: one read
// back from a table, say. A map element's container must be among r's maps, or
// e must have a value.
func (r *Ruleset) AddKnftElement(e *knftables.Element) {
	c := Container(e)
	_, isMap := r.Maps[c]
	r.AddElement(c, ElementKey(e), ElemOf(e, isMap || e.Map != ""))
}

// IsMap reports whether r's set or map cont is a map.
func (r *Ruleset) IsMap(cont string) bool {
	_, ok := r.Maps[cont]
	return ok
}

// NumObjects returns the number of chains, rules, sets, maps and elements.
func (r *Ruleset) NumObjects() int {
	n := len(r.Chains) + len(r.Sets) + len(r.Maps)
	for _, c := range r.Chains {
		n += len(c.Rules)
	}
	for _, es := range r.Elements {
		n += len(es)
	}
	return n
}

// TableObject returns the knftables Table of the ruleset.
func (r *Ruleset) TableObject() *knftables.Table {
	t := &knftables.Table{Family: r.Family, Name: r.Table}
	if r.Comment != "" {
		t.Comment = knftables.PtrTo(r.Comment)
	}
	return t
}

// AddTo queues the whole ruleset on tx with "add" operations, in an order the kernel
// accepts: the table, chains, sets and maps first, then rules, then elements.
func (r *Ruleset) AddTo(tx interface{ Add(knftables.Object) }) {
	tx.Add(r.TableObject())
	chains := SortedKeys(r.Chains)
	for _, name := range chains {
		tx.Add(r.ChainObject(name))
	}
	for _, name := range SortedKeys(r.Sets) {
		tx.Add(r.SetObject(name))
	}
	for _, name := range SortedKeys(r.Maps) {
		tx.Add(r.MapObject(name))
	}
	// The qualified copies of the rules and elements, which the transaction keeps,
	// are allocated together: a large table has hundreds of thousands.
	n := 0
	for _, name := range chains {
		n += len(r.Chains[name].Rules)
	}
	rules := make([]knftables.Rule, 0, n)
	for _, name := range chains {
		for _, rule := range r.Chains[name].Rules {
			rules = append(rules, *rule)
			kr := &rules[len(rules)-1]
			kr.Family, kr.Table, kr.Chain = r.Family, r.Table, name
			tx.Add(kr)
		}
	}
	n = 0
	for _, es := range r.Elements {
		n += len(es)
	}
	elems := make([]knftables.Element, 0, n)
	var sorted []keyed[Elem]
	for _, c := range SortedKeys(r.Elements) {
		isMap := r.IsMap(c)
		sorted = sortedEntries(r.Elements[c], sorted[:0])
		for _, ke := range sorted {
			elems = append(elems, knftables.Element{})
			e := &elems[len(elems)-1]
			fillElement(e, c, isMap, ke.k, ke.v, nil)
			e.Family, e.Table = r.Family, r.Table
			tx.Add(e)
		}
	}
}

// keyed is an entry of a map.
type keyed[V any] struct {
	k string
	v V
}

// sortedEntries appends the entries of m to buf, sorted by key.
func sortedEntries[V any](m map[string]V, buf []keyed[V]) []keyed[V] {
	for k, v := range m {
		buf = append(buf, keyed[V]{k, v})
	}
	slices.SortFunc(buf, func(a, b keyed[V]) int { return strings.Compare(a.k, b.k) })
	return buf
}

// ChainObject returns the named chain, qualified with the ruleset's family and table.
func (r *Ruleset) ChainObject(name string) *knftables.Chain {
	c := r.Chains[name].Chain
	c.Family, c.Table = r.Family, r.Table
	return &c
}

// SetObject returns the named set, qualified with the ruleset's family and table.
func (r *Ruleset) SetObject(name string) *knftables.Set {
	s := *r.Sets[name]
	s.Family, s.Table = r.Family, r.Table
	return &s
}

// MapObject returns the named map, qualified with the ruleset's family and table.
func (r *Ruleset) MapObject(name string) *knftables.Map {
	m := *r.Maps[name]
	m.Family, m.Table = r.Family, r.Table
	return &m
}

// AddRulesTo queues every rule of the named chain on tx (a knftables.Transaction,
// or anything that queues added objects), in order.
func (r *Ruleset) AddRulesTo(tx interface{ Add(knftables.Object) }, chain string) {
	for _, rule := range r.Chains[chain].Rules {
		tx.Add(r.RuleObject(chain, rule))
	}
}

// RuleObject returns a copy of rule, of the named chain, with r's family and table
// filled in, as a transaction wants it.
func (r *Ruleset) RuleObject(chain string, rule *knftables.Rule) *knftables.Rule {
	kr := *rule
	kr.Family, kr.Table, kr.Chain = r.Family, r.Table, chain
	return &kr
}

// ElementObject returns the element of cont with the key text key, qualified
// with the ruleset's family and table; cont is a map when isMap.
func (r *Ruleset) ElementObject(cont string, isMap bool, key string, e Elem) *knftables.Element {
	ke := ToElement(cont, isMap, key, e)
	ke.Family, ke.Table = r.Family, r.Table
	return ke
}

// SortedKeys returns the keys of m in order.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
