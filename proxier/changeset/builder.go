package changeset

import (
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
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
// ruleset.Build documents; when the owner goes away the other is rebuilt and
// takes over.
//
// The first Update of every Service builds them on up to GOMAXPROCS goroutines, as
// ruleset.Build does; later ones cost O(the changed Services), not O(the cluster). A
// Builder is not safe for concurrent use.
type Builder struct {
	cfg    ruleset.Config
	family knftables.Family

	rs   *ruleset.Ruleset
	node state.Node
	// base owns the objects that belong to no Service; svcs holds the owner of the
	// fragment of each Service that has one.
	base *owner
	svcs map[state.ServiceName]*owner
	// dispatch owns the dispatch chains, derived from the merged class sets.
	dispatch *owner
	// The index of the chains, sets and maps of the table, by kind: the owners of
	// each and their versions of it; and that of the elements, by set or map
	// (elements.go), also by number.
	chains, sets, maps *objTable
	elems              map[string]*elemTable
	elemTabs           []*elemTable
	// owners holds every owner by number (nil for a free number); free lists the
	// free numbers.
	owners []*owner
	free   []int32
	// claims holds the claimants of each frontend key, best first.
	claims map[string]*claimSet
	// keyBuf is scratch space to spell frontend keys; snaps lists the owners of the
	// keys the Service being rebuilt had or claims, as they were before.
	keyBuf []byte
	snaps  []claimSnap

	// fresh is true during the first Update, when every object is new: the Delta is
	// then the whole ruleset and the objects' earlier versions need no recording.
	fresh bool
	// touched lists the objects the current Update touched, with their effective
	// version before it; dirty the Services whose frontend ownership it changed.
	// elemTouches and touchedElems do the same for elements.
	touched      []touch
	elemTouches  []elemTouch
	touchedElems map[elemRef]struct{}
	dirty        map[state.ServiceName]bool
}

// owner is the owner of a fragment: the node ("", first of all) or a Service
// (named namespace/name). The owners of an object are ordered by name, and the
// first one's version of it is the effective one.
type owner struct {
	name string
	// id is the owner's number, which the element index holds.
	id int32
	// objs are the chains, sets and maps of the owner's fragment, elems its
	// elements.
	objs  []*entry
	elems []elemRef
	// claims are the frontend keys the Service claims.
	claims []*claimSet
}

// objTable indexes the chains, sets or maps by name.
type objTable struct {
	kind    objKind
	entries map[string]*entry
}

// entry is one object of the table and the owners that have it.
type entry struct {
	tab  *objTable
	name string
	// first is the first owner (nil when none is left) and val its version, the
	// effective one; more holds the other owners, in order.
	first *owner
	val   any
	more  *ownerList
	// touched is set once the current Update recorded the object's version before
	// it; inOld marks, during replace, the objects of the owner's old fragment.
	touched, inOld bool
}

type touch struct {
	e      *entry
	before any
}

type objKind uint8

const (
	kindChain objKind = iota
	kindSet
	kindMap
)

// claimSet holds the claimants of one frontend key, best first.
type claimSet struct {
	key string
	cs  []ruleset.Claimant
	// snapped is set while a rebuild holds a claimSnap of the key.
	snapped bool
}

// claimSnap is the owner of a frontend key before a Service's rebuild (the zero
// claimant for none).
type claimSnap struct {
	set   *claimSet
	first ruleset.Claimant
}

// NewBuilder returns a Builder for one family (ip or ip6) with an empty ruleset.
// cfg must already be defaulted and valid.
func NewBuilder(cfg ruleset.Config, family knftables.Family) *Builder {
	ruleset.CheckFamily(family)
	return &Builder{
		cfg:    cfg,
		family: family,
		rs:     ruleset.New(family, cfg.Table),
		svcs:   map[state.ServiceName]*owner{},
		chains: &objTable{kind: kindChain, entries: map[string]*entry{}},
		sets:   &objTable{kind: kindSet, entries: map[string]*entry{}},
		maps:   &objTable{kind: kindMap, entries: map[string]*entry{}},
		elems:  map[string]*elemTable{},
		claims: map[string]*claimSet{},
	}
}

// Update brings the ruleset to st, rebuilding the fragments of the changed Services
// (all of them when changed is nil) and the node's objects, and returns the ruleset
// and what changed. The Ruleset is the Builder's own: it stays valid, and changes,
// with later Updates; callers must not modify it.
func (b *Builder) Update(st *state.ClusterState, changed map[state.ServiceName]bool) (*ruleset.Ruleset, *Delta) {
	b.advance(st, changed)
	d := b.delta()
	b.fresh = false
	return b.rs, d
}

// Index is the first Update, of every Service of st, without the Delta, which
// would list the whole ruleset: for a caller that has written that ruleset already
// (from ruleset.Build, which gives the same). It returns the Builder's ruleset, as
// Update does. Later Updates report their Deltas as usual. On a Builder updated
// before, Index is Update(st, nil) with its Delta dropped.
func (b *Builder) Index(st *state.ClusterState) *ruleset.Ruleset {
	b.advance(st, nil)
	if !b.fresh {
		b.delta() // clears what the Update recorded
	}
	b.fresh = false
	return b.rs
}

// advance is Update without the Delta, which b.touched, b.elemTouches and b.fresh
// leave to b.delta.
func (b *Builder) advance(st *state.ClusterState, changed map[state.ServiceName]bool) {
	if b.base == nil && changed == nil && b.populate(st) {
		b.settleDispatch()
		return
	}
	b.fresh = b.base == nil
	b.touched = b.touched[:0]
	b.dirty = map[state.ServiceName]bool{}
	b.rs.Comment = ruleset.TableComment

	b.node = st.Node
	if b.base == nil {
		b.base = b.newOwner("")
	}
	b.replace(b.base, ruleset.BuildBase(b.cfg, b.family, st))

	var names []state.ServiceName
	if changed == nil {
		names = make([]state.ServiceName, 0, len(b.svcs)+len(st.Services))
		for n := range b.svcs {
			names = append(names, n)
		}
		for n := range st.Services {
			if _, ok := b.svcs[n]; !ok {
				names = append(names, n)
			}
		}
	} else {
		for n := range changed {
			names = append(names, n)
		}
	}
	for len(names) > 0 {
		slices.SortFunc(names, ruleset.CompareServiceNames)
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
	b.dirty = nil
	b.settleDispatch()
}

// settleDispatch brings the dispatch chains in line with the class sets the
// fragments left in the ruleset.
func (b *Builder) settleDispatch() {
	if b.dispatch == nil {
		b.dispatch = b.newOwner("")
	}
	b.replace(b.dispatch, ruleset.DispatchChainsOf(b.rs))
}

// rebuild replaces the fragment of Service n by one built from st. Services whose
// frontends changed hands in the process (net of n's own claims being withdrawn and
// made again) are marked for rebuilding.
func (b *Builder) rebuild(st *state.ClusterState, n state.ServiceName) {
	o := b.svcs[n]
	if o == nil {
		o = b.newOwner(n.String())
	}
	b.snaps = b.snaps[:0]
	for _, set := range o.claims {
		b.snapshot(set)
		set.cs = slices.DeleteFunc(set.cs, func(c ruleset.Claimant) bool { return c.Service == n })
	}
	clear(o.claims)
	o.claims = o.claims[:0]
	var frag *ruleset.Ruleset
	if svc := st.Services[n]; svc != nil {
		frag = ruleset.BuildService(b.cfg, b.family, st, svc, func(key []string, id string, prio int) bool {
			return b.claim(o, n, key, id, prio)
		})
	}
	if frag == nil {
		for _, set := range o.claims {
			set.cs = slices.DeleteFunc(set.cs, func(c ruleset.Claimant) bool { return c.Service == n })
		}
		o.claims = nil
	}
	for _, sn := range b.snaps {
		set := sn.set
		set.snapped = false
		var now ruleset.Claimant
		if len(set.cs) > 0 {
			now = set.cs[0]
		} else if b.claims[set.key] == set {
			delete(b.claims, set.key)
		}
		if now.Service == sn.first.Service && now.ID == sn.first.ID {
			continue
		}
		for _, c := range []ruleset.Claimant{sn.first, now} {
			if c.Service != n && c.Service != (state.ServiceName{}) {
				b.dirty[c.Service] = true
			}
		}
	}
	clear(b.snaps)
	b.snaps = b.snaps[:0]
	b.replace(o, frag)
	if frag == nil {
		delete(b.svcs, n)
		b.freeOwner(o)
	} else {
		b.svcs[n] = o
	}
}

// snapshot records the owner of set before the Service being rebuilt changes it.
func (b *Builder) snapshot(set *claimSet) {
	if set.snapped {
		return
	}
	set.snapped = true
	sn := claimSnap{set: set}
	if len(set.cs) > 0 {
		sn.first = set.cs[0]
	}
	b.snaps = append(b.snaps, sn)
}

// claim registers Service port id of Service n (owner o) as a claimant of frontend
// key and reports whether it owns it.
func (b *Builder) claim(o *owner, n state.ServiceName, key []string, id string, prio int) bool {
	b.keyBuf = appendKey(b.keyBuf[:0], key)
	set := b.claims[string(b.keyBuf)]
	if set == nil {
		set = &claimSet{key: string(b.keyBuf)}
		b.claims[set.key] = set
	}
	b.snapshot(set)
	c := ruleset.Claimant{Prio: prio, ID: id, Service: n}
	i, found := slices.BinarySearchFunc(set.cs, c, ruleset.CompareClaimants)
	if !found {
		set.cs = slices.Insert(set.cs, i, c)
		o.claims = append(o.claims, set)
	}
	return set.cs[0].Service == n && set.cs[0].ID == id
}

// appendKey appends key spelt as ruleset.ElementKey spells it, " . " between the
// fields.
func appendKey(buf []byte, key []string) []byte {
	for i, k := range key {
		if i > 0 {
			buf = append(buf, " . "...)
		}
		buf = append(buf, k...)
	}
	return buf
}

// newOwner returns a new owner named name, numbered.
func (b *Builder) newOwner(name string) *owner {
	o := &owner{name: name}
	if n := len(b.free); n > 0 {
		o.id, b.free = b.free[n-1], b.free[:n-1]
		b.owners[o.id] = o
	} else {
		o.id = int32(len(b.owners))
		b.owners = append(b.owners, o)
	}
	return o
}

// freeOwner frees the number of o, which owns nothing any more.
func (b *Builder) freeOwner(o *owner) {
	b.owners[o.id] = nil
	b.free = append(b.free, o.id)
}

// replace makes frag (nil for none) the fragment of o: the objects of both its old
// fragment and frag take o's new version, the others are owned or disowned.
func (b *Builder) replace(o *owner, frag *ruleset.Ruleset) {
	b.replaceElems(o, frag)
	for _, e := range o.objs {
		e.inOld = true
	}
	var objs []*entry
	if frag != nil {
		objs = make([]*entry, 0, len(frag.Chains)+len(frag.Sets)+len(frag.Maps))
		keep := func(t *objTable, name string, v any) {
			e := t.entries[name]
			if e == nil {
				e = &entry{tab: t, name: name}
				t.entries[name] = e
			}
			if e.inOld {
				e.inOld = false
				b.update(e, o, v)
			} else {
				b.own(e, o, v)
			}
			objs = append(objs, e)
		}
		for n, c := range frag.Chains {
			keep(b.chains, n, c)
		}
		for n, s := range frag.Sets {
			keep(b.sets, n, s)
		}
		for n, m := range frag.Maps {
			keep(b.maps, n, m)
		}
	}
	for _, e := range o.objs {
		if e.inOld {
			e.inOld = false
			b.disown(e, o)
		}
	}
	o.objs = objs
}

// touch records the effective version of e before the current Update changes it.
func (b *Builder) touch(e *entry) {
	if !b.fresh && !e.touched {
		e.touched = true
		b.touched = append(b.touched, touch{e: e, before: e.val})
	}
}

// own adds o, with version v, to the owners of e.
func (b *Builder) own(e *entry, o *owner, v any) {
	if e.first == nil {
		b.touch(e)
		e.first, e.val = o, v
		b.setEffective(e)
		return
	}
	if ruleset.EqualObjects(e.val, v) {
		v = e.val // one copy of identical versions is enough
	}
	if e.more == nil {
		e.more = &ownerList{}
	}
	if o.name > e.first.name {
		e.more.insert(b.owners, o, v)
		return
	}
	b.touch(e)
	e.more.insert(b.owners, e.first, e.val)
	changed := v != e.val
	e.first, e.val = o, v
	if changed {
		b.setEffective(e)
	}
}

// update makes v the version of e of o, which already owns it.
func (b *Builder) update(e *entry, o *owner, v any) {
	if e.first != o {
		e.more.set(b.owners, o, v)
		return
	}
	if ruleset.EqualObjects(e.val, v) {
		return
	}
	b.touch(e)
	e.val = v
	b.setEffective(e)
}

// disown removes o from the owners of e.
func (b *Builder) disown(e *entry, o *owner) {
	if e.first != o {
		e.more.remove(b.owners, o)
		return
	}
	b.touch(e)
	if e.more == nil || e.more.len() == 0 {
		e.first, e.val, e.more = nil, nil, nil
		b.setEffective(e)
		if b.fresh {
			// There is no earlier version to compare with: drop the object now.
			delete(e.tab.entries, e.name)
		}
		return
	}
	old := e.val
	e.first, e.val = e.more.popFirst(b.owners)
	if e.val != old {
		b.setEffective(e)
	}
}

// setEffective puts the effective version of e (none when it has no owner left)
// into the merged ruleset.
func (b *Builder) setEffective(e *entry) {
	t := e.tab
	switch t.kind {
	case kindChain:
		if e.first == nil {
			delete(b.rs.Chains, e.name)
		} else {
			b.rs.Chains[e.name] = e.val.(*ruleset.Chain)
		}
	case kindSet:
		if e.first == nil {
			delete(b.rs.Sets, e.name)
		} else {
			b.rs.Sets[e.name] = e.val.(*knftables.Set)
		}
	case kindMap:
		if e.first == nil {
			delete(b.rs.Maps, e.name)
		} else {
			b.rs.Maps[e.name] = e.val.(*knftables.Map)
		}
	}
}

// delta returns what the Update changed: every object it touched, compared with
// its version before, or, after a first Update, the whole ruleset.
func (b *Builder) delta() *Delta {
	if b.fresh {
		return wholeDelta(b.rs)
	}
	d := NewDelta()
	for _, t := range b.touched {
		e := t.e
		e.touched = false
		old, cur := t.before, e.val
		if e.first == nil {
			delete(e.tab.entries, e.name)
		}
		if old == cur {
			continue // both nil, or the very same version
		}
		switch e.tab.kind {
		case kindChain:
			o, n := asPtr[ruleset.Chain](old), asPtr[ruleset.Chain](cur)
			if o == nil || n == nil || !ruleset.SameChain(o, n) {
				d.Chains[e.name] = Change[*ruleset.Chain]{o, n}
			}
		case kindSet:
			o, n := asPtr[knftables.Set](old), asPtr[knftables.Set](cur)
			if o == nil || n == nil || !ruleset.SameSet(o, n) {
				d.Sets[e.name] = Change[*knftables.Set]{o, n}
			}
		case kindMap:
			o, n := asPtr[knftables.Map](old), asPtr[knftables.Map](cur)
			if o == nil || n == nil || !ruleset.SameMap(o, n) {
				d.Maps[e.name] = Change[*knftables.Map]{o, n}
			}
		}
	}
	clear(b.touched)
	b.touched = b.touched[:0]
	if cap(b.touched) > 1<<12 {
		b.touched = nil // after an Update of everything: do not keep its size
	}
	b.elemDelta(d)
	return d
}
