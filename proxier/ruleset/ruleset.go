// Package ruleset builds the nftables ruleset the proxier wants for a ClusterState.
// Build is a pure function of state and Config; it performs no I/O. The Ruleset it
// returns is plain data; proxier/changeset builds the same layout incrementally
// and reports what changed, for proxier/syncer to apply.
package ruleset

import (
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
	// ElementKey of the element.
	Elements map[string]map[string]*knftables.Element
}

// New returns an empty Ruleset for the given family and table name.
func New(family knftables.Family, table string) *Ruleset {
	return &Ruleset{
		Family:   family,
		Table:    table,
		Chains:   map[string]*Chain{},
		Sets:     map[string]*knftables.Set{},
		Maps:     map[string]*knftables.Map{},
		Elements: map[string]map[string]*knftables.Element{},
	}
}

// ElementKey is the identity of an element within its set or map.
func ElementKey(e *knftables.Element) string { return strings.Join(e.Key, " . ") }

// Container returns the name of the set or map an element belongs to.
func Container(e *knftables.Element) string {
	if e.Set != "" {
		return e.Set
	}
	return e.Map
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

// AddElement adds (or replaces) an element of a set or map.
func (r *Ruleset) AddElement(e *knftables.Element) {
	c := Container(e)
	es := r.Elements[c]
	if es == nil {
		es = map[string]*knftables.Element{}
		r.Elements[c] = es
	}
	es[ElementKey(e)] = e
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
	var sorted []keyed[*knftables.Element]
	for _, c := range SortedKeys(r.Elements) {
		sorted = sortedEntries(r.Elements[c], sorted[:0])
		for _, ke := range sorted {
			elems = append(elems, *ke.v)
			e := &elems[len(elems)-1]
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

func (r *Ruleset) element(e *knftables.Element) *knftables.Element {
	c := *e
	c.Family, c.Table = r.Family, r.Table
	return &c
}

// ElementObject returns e qualified with the ruleset's family and table.
func (r *Ruleset) ElementObject(e *knftables.Element) *knftables.Element { return r.element(e) }

// SortedKeys returns the keys of m in order.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
