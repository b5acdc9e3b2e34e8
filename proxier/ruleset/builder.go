package ruleset

import (
	"reflect"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// Builder builds the ruleset of one family incrementally. Each Service contributes
// a fragment of objects (its map elements, and the chains and sets it uses); the
// Builder keeps every fragment and merges them into one Ruleset, so that an Update
// for a few changed Services costs O(their size), whatever the size of the
// cluster, and reports exactly what changed as a Delta for the syncer.
//
// Objects several fragments share (a dnat-N chain, a hairpin element) stay as long
// as one fragment has them. Frontends two Services claim go to one of them, as
// Build documents; when the owner goes away the other is rebuilt and takes over.
type Builder struct {
	cfg    Config
	family knftables.Family

	rs    *Ruleset
	node  state.Node
	base  *Ruleset
	frags map[state.ServiceName]*Ruleset
	// objects holds, per object, the fragments that have it.
	objects map[objKey]*entry
	claims  map[string][]claimant
	// svcClaims lists the frontend keys each Service claims.
	svcClaims map[state.ServiceName][]string

	// gen counts Updates; touched lists the objects the current one touched, and
	// dirty the Services whose frontend ownership it changed.
	gen     uint64
	touched []objKey
	dirty   map[state.ServiceName]bool
}

// entry is one object of the table: the fragments that have it, base ("") first and
// then by Service name (the first one's version is the effective one), and its
// effective version before the Update numbered gen, which touched it.
type entry struct {
	owners []owned
	gen    uint64
	before any
}

type objKind uint8

const (
	kindChain objKind = iota
	kindSet
	kindMap
	kindElement
)

// objKey identifies an object of the table; container is the set or map of an
// element.
type objKey struct {
	kind      objKind
	container string
	name      string
}

type owned struct {
	owner string
	val   any
}

type claimant struct {
	prio int
	id   string
	svc  state.ServiceName
}

// Change is an object before and after an Update; Old is nil for a new object and
// New nil for a removed one.
type Change[T any] struct {
	Old, New T
}

// Delta is what an Update changed in the ruleset.
type Delta struct {
	Chains   map[string]Change[*Chain]
	Sets     map[string]Change[*knftables.Set]
	Maps     map[string]Change[*knftables.Map]
	Elements map[string]map[string]Change[*knftables.Element]
}

// NewDelta returns an empty Delta.
func NewDelta() *Delta {
	return &Delta{
		Chains:   map[string]Change[*Chain]{},
		Sets:     map[string]Change[*knftables.Set]{},
		Maps:     map[string]Change[*knftables.Map]{},
		Elements: map[string]map[string]Change[*knftables.Element]{},
	}
}

// Len returns the number of objects that changed.
func (d *Delta) Len() int {
	n := len(d.Chains) + len(d.Sets) + len(d.Maps)
	for _, es := range d.Elements {
		n += len(es)
	}
	return n
}

// Diff returns the Delta that turns old into desired (old may be nil, for an empty
// table). It costs O(size of both).
func Diff(old, desired *Ruleset) *Delta {
	if old == nil {
		old = New(desired.Family, desired.Table)
	}
	d := NewDelta()
	diffMaps(old.Chains, desired.Chains, d.Chains, sameChain)
	diffMaps(old.Sets, desired.Sets, d.Sets, func(a, b *knftables.Set) bool { return reflect.DeepEqual(a, b) })
	diffMaps(old.Maps, desired.Maps, d.Maps, func(a, b *knftables.Map) bool { return reflect.DeepEqual(a, b) })
	for _, c := range unionKeys(old.Elements, desired.Elements) {
		m := map[string]Change[*knftables.Element]{}
		diffMaps(old.Elements[c], desired.Elements[c], m, sameElement)
		if len(m) > 0 {
			d.Elements[c] = m
		}
	}
	return d
}

func diffMaps[T comparable](old, desired map[string]T, out map[string]Change[T], same func(a, b T) bool) {
	var zero T
	for k, o := range old {
		if n, ok := desired[k]; !ok {
			out[k] = Change[T]{Old: o}
		} else if !same(o, n) {
			out[k] = Change[T]{Old: o, New: n}
		}
	}
	for k, n := range desired {
		if _, ok := old[k]; !ok {
			out[k] = Change[T]{Old: zero, New: n}
		}
	}
}

func unionKeys[V any](a, b map[string]V) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func sameChain(a, b *Chain) bool {
	return reflect.DeepEqual(a.Chain, b.Chain) && slices.EqualFunc(a.Rules, b.Rules, func(x, y *knftables.Rule) bool {
		return reflect.DeepEqual(x, y)
	})
}

func sameElement(a, b *knftables.Element) bool { return reflect.DeepEqual(a, b) }

// NewBuilder returns a Builder for one family (ip or ip6) with an empty ruleset.
// cfg must already be defaulted and valid.
func NewBuilder(cfg Config, family knftables.Family) *Builder {
	checkFamily(family)
	return &Builder{
		cfg:       cfg,
		family:    family,
		rs:        New(family, cfg.Table),
		frags:     map[state.ServiceName]*Ruleset{},
		objects:   map[objKey]*entry{},
		claims:    map[string][]claimant{},
		svcClaims: map[state.ServiceName][]string{},
	}
}

// Update brings the ruleset to st, rebuilding the fragments of the changed Services
// (all of them when changed is nil) and the node's objects, and returns the ruleset
// and what changed. The Ruleset is the Builder's own: it stays valid, and changes,
// with later Updates; callers must not modify it.
func (b *Builder) Update(st *state.ClusterState, changed map[state.ServiceName]bool) (*Ruleset, *Delta) {
	b.gen++
	b.touched = b.touched[:0]
	if len(b.objects) == 0 {
		// A first build: size the index for a typical Service's dozen objects, which
		// saves rehashing it over and over as it grows.
		est := 200 + 12*len(st.Services)
		b.objects = make(map[objKey]*entry, est)
		b.touched = make([]objKey, 0, est)
	}
	b.dirty = map[state.ServiceName]bool{}
	b.rs.Comment = TableComment

	b.node = st.Node
	base := buildBase(b.cfg, b.family, st.Node)
	b.replace("", b.base, base)
	b.base = base

	var names []state.ServiceName
	if changed == nil {
		for n := range b.frags {
			names = append(names, n)
		}
		for n := range st.Services {
			names = append(names, n)
		}
	} else {
		for n := range changed {
			names = append(names, n)
		}
	}
	for len(names) > 0 {
		sortNames(names)
		names = slices.Compact(names)
		for _, n := range names {
			b.rebuild(st, n)
		}
		// Services that gained or lost a frontend to the ones just rebuilt.
		names = names[:0]
		for n := range b.dirty {
			names = append(names, n)
		}
		clear(b.dirty)
	}
	return b.rs, b.delta()
}

func sortNames(ns []state.ServiceName) {
	slices.SortFunc(ns, compareNames)
}

func compareNames(a, b state.ServiceName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// rebuild replaces the fragment of Service n by one built from st.
func (b *Builder) rebuild(st *state.ClusterState, n state.ServiceName) {
	for _, k := range b.svcClaims[n] {
		b.unclaim(k, n)
	}
	delete(b.svcClaims, n)
	var frag *Ruleset
	if svc := st.Services[n]; svc != nil {
		frag = buildService(b.cfg, b.family, st, svc, func(key []string, id string, prio int) bool {
			return b.claim(n, strings.Join(key, " . "), id, prio)
		})
	}
	b.replace(n.String(), b.frags[n], frag)
	if frag == nil {
		delete(b.frags, n)
	} else {
		b.frags[n] = frag
	}
}

// claim registers Service port id of Service n as a claimant of frontend k and
// reports whether it owns it. A claimant that displaces the owner marks the
// owner's Service for rebuilding.
func (b *Builder) claim(n state.ServiceName, k, id string, prio int) bool {
	cs := b.claims[k]
	c := claimant{prio: prio, id: id, svc: n}
	i, found := slices.BinarySearchFunc(cs, c, compareClaimants)
	if !found {
		if i == 0 && len(cs) > 0 && cs[0].svc != n {
			b.dirty[cs[0].svc] = true
		}
		cs = slices.Insert(cs, i, c)
		b.claims[k] = cs
		b.svcClaims[n] = append(b.svcClaims[n], k)
	}
	return cs[0].svc == n && cs[0].id == id
}

// unclaim removes Service n's claims on k; a new owner is marked for rebuilding.
func (b *Builder) unclaim(k string, n state.ServiceName) {
	cs := b.claims[k]
	wasOwner := len(cs) > 0 && cs[0].svc == n
	cs = slices.DeleteFunc(cs, func(c claimant) bool { return c.svc == n })
	if len(cs) == 0 {
		delete(b.claims, k)
		return
	}
	b.claims[k] = cs
	if wasOwner && cs[0].svc != n {
		b.dirty[cs[0].svc] = true
	}
}

func compareClaimants(a, b claimant) int {
	if a.prio != b.prio {
		return a.prio - b.prio
	}
	if c := compareNames(a.svc, b.svc); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

// replace swaps the objects owner contributed in old for those of frag.
func (b *Builder) replace(owner string, old, frag *Ruleset) {
	if old != nil {
		forEachObject(old, func(k objKey, _ any) { b.disown(k, owner) })
	}
	if frag != nil {
		forEachObject(frag, func(k objKey, v any) { b.own(k, owner, v) })
	}
}

func forEachObject(r *Ruleset, fn func(objKey, any)) {
	for n, c := range r.Chains {
		fn(objKey{kind: kindChain, name: n}, c)
	}
	for n, s := range r.Sets {
		fn(objKey{kind: kindSet, name: n}, s)
	}
	for n, m := range r.Maps {
		fn(objKey{kind: kindMap, name: n}, m)
	}
	for c, es := range r.Elements {
		for k, e := range es {
			fn(objKey{kind: kindElement, container: c, name: k}, e)
		}
	}
}

// entry returns the entry of k, recording its version before this Update on the
// first touch.
func (b *Builder) entry(k objKey) *entry {
	e := b.objects[k]
	if e == nil {
		e = &entry{}
		b.objects[k] = e
	}
	if e.gen != b.gen {
		e.gen = b.gen
		e.before = e.effective()
		b.touched = append(b.touched, k)
	}
	return e
}

func (e *entry) effective() any {
	if e != nil && len(e.owners) > 0 {
		return e.owners[0].val
	}
	return nil
}

func (b *Builder) own(k objKey, owner string, v any) {
	e := b.entry(k)
	i, _ := slices.BinarySearchFunc(e.owners, owner, func(o owned, name string) int { return strings.Compare(o.owner, name) })
	e.owners = slices.Insert(e.owners, i, owned{owner: owner, val: v})
	if i == 0 {
		b.setEffective(k, v)
	}
}

func (b *Builder) disown(k objKey, owner string) {
	e := b.entry(k)
	// Shared objects (a dnat-N chain) have thousands of owners: search, don't scan.
	i, found := slices.BinarySearchFunc(e.owners, owner, func(o owned, name string) int { return strings.Compare(o.owner, name) })
	if !found {
		return
	}
	e.owners = slices.Delete(e.owners, i, i+1)
	if i == 0 {
		b.setEffective(k, e.effective())
	}
}

// setEffective puts v, the effective version of k, into the merged ruleset.
func (b *Builder) setEffective(k objKey, v any) {
	switch k.kind {
	case kindChain:
		if v == nil {
			delete(b.rs.Chains, k.name)
		} else {
			b.rs.Chains[k.name] = v.(*Chain)
		}
	case kindSet:
		if v == nil {
			delete(b.rs.Sets, k.name)
		} else {
			b.rs.Sets[k.name] = v.(*knftables.Set)
		}
	case kindMap:
		if v == nil {
			delete(b.rs.Maps, k.name)
		} else {
			b.rs.Maps[k.name] = v.(*knftables.Map)
		}
	case kindElement:
		if v == nil {
			if es := b.rs.Elements[k.container]; es != nil {
				delete(es, k.name)
				if len(es) == 0 {
					delete(b.rs.Elements, k.container)
				}
			}
		} else {
			b.rs.AddElement(v.(*knftables.Element))
		}
	}
}

// delta compares every object touched during the Update with its version before.
func (b *Builder) delta() *Delta {
	d := NewDelta()
	for _, k := range b.touched {
		e := b.objects[k]
		old, cur := e.before, e.effective()
		e.before = nil
		if len(e.owners) == 0 {
			delete(b.objects, k)
		}
		if old == nil && cur == nil {
			continue
		}
		switch k.kind {
		case kindChain:
			o, n := asPtr[Chain](old), asPtr[Chain](cur)
			if o == nil || n == nil || !sameChain(o, n) {
				d.Chains[k.name] = Change[*Chain]{o, n}
			}
		case kindSet:
			o, n := asPtr[knftables.Set](old), asPtr[knftables.Set](cur)
			if o == nil || n == nil || !reflect.DeepEqual(o, n) {
				d.Sets[k.name] = Change[*knftables.Set]{o, n}
			}
		case kindMap:
			o, n := asPtr[knftables.Map](old), asPtr[knftables.Map](cur)
			if o == nil || n == nil || !reflect.DeepEqual(o, n) {
				d.Maps[k.name] = Change[*knftables.Map]{o, n}
			}
		case kindElement:
			o, n := asPtr[knftables.Element](old), asPtr[knftables.Element](cur)
			if o == nil || n == nil || !sameElement(o, n) {
				if d.Elements[k.container] == nil {
					d.Elements[k.container] = map[string]Change[*knftables.Element]{}
				}
				d.Elements[k.container][k.name] = Change[*knftables.Element]{o, n}
			}
		}
	}
	b.touched = b.touched[:0]
	return d
}

func asPtr[T any](v any) *T {
	if v == nil {
		return nil
	}
	return v.(*T)
}
