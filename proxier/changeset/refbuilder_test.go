package changeset

// This file keeps the original (pre-optimization) Builder as an oracle for the
// property tests: the optimized Builder and ruleset.Build must give exactly its rulesets
// and Deltas.

import (
	"errors"
	"reflect"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// refBuilder builds the ruleset of one family incrementally. Each Service contributes
// a fragment of objects (its map elements, and the chains and sets it uses); the
// refBuilder keeps every fragment and merges them into one ruleset.Ruleset, so that an Update
// for a few changed Services costs O(their size), whatever the size of the
// cluster, and reports exactly what changed as a Delta for the syncer.
//
// Objects several fragments share (a dnat-N chain, a hairpin element) stay as long
// as one fragment has them. Frontends two Services claim go to one of them, as
// ruleset.Build documents; when the owner goes away the other is rebuilt and
// takes over.
type refBuilder struct {
	cfg    ruleset.Config
	family knftables.Family

	rs    *ruleset.Ruleset
	node  state.Node
	base  *ruleset.Ruleset
	frags map[state.ServiceName]*ruleset.Ruleset
	// dispatch holds the dispatch chains derived from the merged class sets.
	dispatch *ruleset.Ruleset
	// objects holds, per object, the fragments that have it.
	objects map[refObjKey]*refEntry
	claims  map[string][]refClaimant
	// svcClaims lists the frontend keys each Service claims.
	svcClaims map[state.ServiceName][]string

	// gen counts Updates; touched lists the objects the current one touched, and
	// dirty the Services whose frontend ownership it changed.
	gen     uint64
	touched []refObjKey
	dirty   map[state.ServiceName]bool
}

// refEntry is one object of the table: the fragments that have it, base ("") first and
// then by Service name (the first one's version is the effective one), and its
// effective version before the Update numbered gen, which touched it.
type refEntry struct {
	owners []refOwned
	gen    uint64
	before any
}

type refObjKind uint8

const (
	refKindChain refObjKind = iota
	refKindSet
	refKindMap
	refKindElement
)

// refObjKey identifies an object of the table; container is the set or map of an
// element.
type refObjKey struct {
	kind      refObjKind
	container string
	name      string
}

type refOwned struct {
	owner string
	val   any
}

type refClaimant struct {
	prio int
	id   string
	svc  state.ServiceName
}

// newRefBuilder returns a refBuilder for one family (ip or ip6) with an empty ruleset.
// cfg must already be defaulted and valid.
func newRefBuilder(cfg ruleset.Config, family knftables.Family) *refBuilder {
	ruleset.CheckFamily(family)
	return &refBuilder{
		cfg:       cfg,
		family:    family,
		rs:        ruleset.New(family, cfg.Table),
		frags:     map[state.ServiceName]*ruleset.Ruleset{},
		objects:   map[refObjKey]*refEntry{},
		claims:    map[string][]refClaimant{},
		svcClaims: map[state.ServiceName][]string{},
	}
}

// Update brings the ruleset to st, rebuilding the fragments of the changed Services
// (all of them when changed is nil) and the node's objects, and returns the ruleset
// and what changed. The ruleset.Ruleset is the refBuilder's own: it stays valid, and changes,
// with later Updates; callers must not modify it.
func (b *refBuilder) Update(st *state.ClusterState, changed map[state.ServiceName]bool) (*ruleset.Ruleset, *Delta) {
	b.gen++
	b.touched = b.touched[:0]
	if len(b.objects) == 0 {
		// A first build: size the index for a typical Service's dozen objects, which
		// saves rehashing it over and over as it grows.
		est := 200 + 12*len(st.Services)
		b.objects = make(map[refObjKey]*refEntry, est)
		b.touched = make([]refObjKey, 0, est)
	}
	b.dirty = map[state.ServiceName]bool{}
	b.rs.Comment = ruleset.TableComment

	b.node = st.Node
	base := ruleset.BuildBase(b.cfg, b.family, st)
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
	for round := 0; len(names) > 0; round++ {
		if round == 100 {
			// The original livelocks when Services claim each other's ClusterIPs.
			panic(errRefLivelock)
		}
		refSortNames(names)
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
	dispatch := ruleset.DispatchChainsOf(b.rs)
	b.replace("", b.dispatch, dispatch)
	b.dispatch = dispatch
	return b.rs, b.delta()
}

// rebuild replaces the fragment of Service n by one built from st.
func (b *refBuilder) rebuild(st *state.ClusterState, n state.ServiceName) {
	for _, k := range b.svcClaims[n] {
		b.unclaim(k, n)
	}
	delete(b.svcClaims, n)
	var frag *ruleset.Ruleset
	if svc := st.Services[n]; svc != nil {
		frag = ruleset.BuildService(b.cfg, b.family, st, svc, func(key []string, id string, prio int) bool {
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

// claim registers Service port id of Service n as a refClaimant of frontend k and
// reports whether it owns it. A refClaimant that displaces the owner marks the
// owner's Service for rebuilding.
func (b *refBuilder) claim(n state.ServiceName, k, id string, prio int) bool {
	cs := b.claims[k]
	c := refClaimant{prio: prio, id: id, svc: n}
	i, found := slices.BinarySearchFunc(cs, c, refCompareClaimants)
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
func (b *refBuilder) unclaim(k string, n state.ServiceName) {
	cs := b.claims[k]
	wasOwner := len(cs) > 0 && cs[0].svc == n
	cs = slices.DeleteFunc(cs, func(c refClaimant) bool { return c.svc == n })
	if len(cs) == 0 {
		delete(b.claims, k)
		return
	}
	b.claims[k] = cs
	if wasOwner && cs[0].svc != n {
		b.dirty[cs[0].svc] = true
	}
}

// replace swaps the objects owner contributed in old for those of frag.
func (b *refBuilder) replace(owner string, old, frag *ruleset.Ruleset) {
	if old != nil {
		refForEachObject(old, func(k refObjKey, _ any) { b.disown(k, owner) })
	}
	if frag != nil {
		refForEachObject(frag, func(k refObjKey, v any) { b.own(k, owner, v) })
	}
}

func refForEachObject(r *ruleset.Ruleset, fn func(refObjKey, any)) {
	for n, c := range r.Chains {
		fn(refObjKey{kind: refKindChain, name: n}, c)
	}
	for n, s := range r.Sets {
		fn(refObjKey{kind: refKindSet, name: n}, s)
	}
	for n, m := range r.Maps {
		fn(refObjKey{kind: refKindMap, name: n}, m)
	}
	for _, x := range r.Listed() {
		fn(refObjKey{kind: refKindElement, container: x.Cont, name: x.Key}, &x.Elem)
	}
}

// refEntry returns the refEntry of k, recording its version before this Update on the
// first touch.
func (b *refBuilder) refEntry(k refObjKey) *refEntry {
	e := b.objects[k]
	if e == nil {
		e = &refEntry{}
		b.objects[k] = e
	}
	if e.gen != b.gen {
		e.gen = b.gen
		e.before = e.effective()
		b.touched = append(b.touched, k)
	}
	return e
}

func (e *refEntry) effective() any {
	if e != nil && len(e.owners) > 0 {
		return e.owners[0].val
	}
	return nil
}

func (b *refBuilder) own(k refObjKey, owner string, v any) {
	e := b.refEntry(k)
	i, _ := slices.BinarySearchFunc(e.owners, owner, func(o refOwned, name string) int { return strings.Compare(o.owner, name) })
	e.owners = slices.Insert(e.owners, i, refOwned{owner: owner, val: v})
	if i == 0 {
		b.setEffective(k, v)
	}
}

func (b *refBuilder) disown(k refObjKey, owner string) {
	e := b.refEntry(k)
	// Shared objects (a dnat-N chain) have thousands of owners: search, don't scan.
	i, found := slices.BinarySearchFunc(e.owners, owner, func(o refOwned, name string) int { return strings.Compare(o.owner, name) })
	if !found {
		return
	}
	e.owners = slices.Delete(e.owners, i, i+1)
	if i == 0 {
		b.setEffective(k, e.effective())
	}
}

// setEffective puts v, the effective version of k, into the merged ruleset.
func (b *refBuilder) setEffective(k refObjKey, v any) {
	switch k.kind {
	case refKindChain:
		if v == nil {
			delete(b.rs.Chains, k.name)
		} else {
			b.rs.Chains[k.name] = v.(*ruleset.Chain)
		}
	case refKindSet:
		if v == nil {
			delete(b.rs.Sets, k.name)
		} else {
			b.rs.Sets[k.name] = v.(*knftables.Set)
		}
	case refKindMap:
		if v == nil {
			delete(b.rs.Maps, k.name)
		} else {
			b.rs.Maps[k.name] = v.(*knftables.Map)
		}
	case refKindElement:
		if v == nil {
			if es := b.rs.Elements[k.container]; es != nil {
				delete(es, k.name)
				if len(es) == 0 {
					delete(b.rs.Elements, k.container)
				}
			}
		} else {
			b.rs.AddElement(k.container, k.name, *v.(*ruleset.Elem))
		}
	}
}

// delta compares every object touched during the Update with its version before.
func (b *refBuilder) delta() *Delta {
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
		case refKindChain:
			o, n := refAsPtr[ruleset.Chain](old), refAsPtr[ruleset.Chain](cur)
			if o == nil || n == nil || !refSameChain(o, n) {
				d.Chains[k.name] = Change[*ruleset.Chain]{o, n}
			}
		case refKindSet:
			o, n := refAsPtr[knftables.Set](old), refAsPtr[knftables.Set](cur)
			if o == nil || n == nil || !reflect.DeepEqual(o, n) {
				d.Sets[k.name] = Change[*knftables.Set]{o, n}
			}
		case refKindMap:
			o, n := refAsPtr[knftables.Map](old), refAsPtr[knftables.Map](cur)
			if o == nil || n == nil || !reflect.DeepEqual(o, n) {
				d.Maps[k.name] = Change[*knftables.Map]{o, n}
			}
		case refKindElement:
			o, n := refAsPtr[ruleset.Elem](old), refAsPtr[ruleset.Elem](cur)
			if o == nil || n == nil || *o != *n {
				if d.Elements[k.container] == nil {
					d.Elements[k.container] = map[string]Change[*ruleset.Elem]{}
				}
				d.Elements[k.container][k.name] = Change[*ruleset.Elem]{o, n}
			}
		}
	}
	b.touched = b.touched[:0]
	return d
}

// errRefLivelock is the panic of a refBuilder that would never finish an Update.
var errRefLivelock = errors.New("refBuilder livelock")

func refAsPtr[T any](v any) *T {
	if v == nil {
		return nil
	}
	return v.(*T)
}

func refSortNames(ns []state.ServiceName) { slices.SortFunc(ns, refCompareNames) }

func refCompareNames(a, b state.ServiceName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

func refCompareClaimants(a, b refClaimant) int {
	if a.prio != b.prio {
		return a.prio - b.prio
	}
	if c := refCompareNames(a.svc, b.svc); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

func refSameChain(a, b *ruleset.Chain) bool {
	return reflect.DeepEqual(a.Chain, b.Chain) && slices.EqualFunc(a.Rules, b.Rules, func(x, y *knftables.Rule) bool {
		return reflect.DeepEqual(x, y)
	})
}
