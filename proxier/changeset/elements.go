package changeset

import (
	"sort"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// The elements of the sets and maps are most of a large table (millions at 100,000
// Services), so the Builder indexes them by value: per set or map, the owner of
// each element by number, with no object of its own. The effective version of an
// element, its first owner's, lives only in the merged Ruleset; the versions of
// the other owners of a shared element (a hairpin endpoint two Services select)
// are kept beside, for the few elements that have them.

// elemTable indexes the elements of one set or map by key (the nft text of the
// element's key, as the Ruleset keys them).
type elemTable struct {
	name string
	rs   *ruleset.Ruleset
	// idx is the table's number in Builder.elemTabs, which elemRefs hold.
	idx int32
	// entries holds the owners of each element.
	entries map[string]elemEntry
	// more holds, for each element with several owners, the owners after the
	// first with their versions, in owner name order.
	more map[string][]elemOwned
	// out is the container's element map in the merged Ruleset (nil while it has
	// no element).
	out map[string]ruleset.Elem
}

// elemEntry is the owners of one element: the first by number, whose version is
// the effective one, and whether more has others.
type elemEntry struct {
	first  int32
	shared bool
}

// elemOwned is an owner of an element after the first, with its version.
type elemOwned struct {
	id  int32
	val ruleset.Elem
}

// elemRef names an element of the table: its set or map by number, and its key.
type elemRef struct {
	tab int32
	key string
}

// elemTouch is an element the current Update touched and its effective version
// before it (had is false when it had none).
type elemTouch struct {
	ref    elemRef
	before ruleset.Elem
	had    bool
}

// elemTable returns the table of the elements of set or map c, adding it.
func (b *Builder) elemTable(c string) *elemTable {
	t := b.elems[c]
	if t == nil {
		t = &elemTable{name: c, rs: b.rs, idx: int32(len(b.elemTabs)), entries: map[string]elemEntry{}, more: map[string][]elemOwned{}}
		b.elems[c] = t
		b.elemTabs = append(b.elemTabs, t)
	}
	return t
}

// replaceElems makes the elements of frag (nil for none) those of o: the elements
// of both its old fragment and frag take o's new version, the others are owned or
// disowned.
func (b *Builder) replaceElems(o *owner, frag *ruleset.Ruleset) {
	old := o.elems
	var refs []elemRef
	if frag != nil {
		list := frag.Listed()
		if len(list) > 0 {
			refs = make([]elemRef, 0, len(list))
		}
		var t *elemTable
		for _, x := range list {
			if t == nil || t.name != x.Cont {
				t = b.elemTable(x.Cont)
			}
			b.putElem(t, x.Key, o, x.Elem)
			refs = append(refs, elemRef{tab: t.idx, key: x.Key})
		}
	}
	if len(old) > 0 {
		b.dropGone(o, old, refs)
	}
	o.elems = refs
}

// dropGone disowns the elements of old, o's previous elements, that refs, its
// new ones, lack.
func (b *Builder) dropGone(o *owner, old, refs []elemRef) {
	if len(old)*len(refs) > dropScan {
		keep := make(map[elemRef]bool, len(refs))
		for _, r := range refs {
			keep[r] = true
		}
		for _, r := range old {
			if !keep[r] {
				b.dropElem(b.elemTabs[r.tab], r.key, o)
			}
		}
		return
	}
	// A Service's elements are a few dozen, mostly listed in the same order
	// from one build to the next: a scan from where the last match was found
	// allocates nothing.
	j := 0
	for _, r := range old {
		found := false
		for k := range refs {
			if x := refs[(j+k)%len(refs)]; x == r {
				found, j = true, (j+k+1)%len(refs)
				break
			}
		}
		if !found {
			b.dropElem(b.elemTabs[r.tab], r.key, o)
		}
	}
}

// dropScan is the largest product of the old and new element counts for which
// dropGone scans rather than maps; tests lower it to take the other path.
var dropScan = 4096

// putElem makes v o's version of element k of t, adding o to its owners when it
// is not one yet.
func (b *Builder) putElem(t *elemTable, k string, o *owner, v ruleset.Elem) {
	e, ok := t.entries[k]
	if !ok {
		b.touchElem(t, k)
		t.entries[k] = elemEntry{first: o.id}
		t.set(k, v)
		return
	}
	if e.first == o.id {
		if cur, ok := t.out[k]; !ok || cur != v {
			b.touchElem(t, k)
			t.set(k, v)
		}
		return
	}
	list := t.more[k]
	if i := findOwned(list, b.owners, o); i >= 0 {
		list[i].val = v
		return
	}
	if o.name > b.owners[e.first].name {
		t.more[k] = insertOwned(list, b.owners, elemOwned{id: o.id, val: v})
	} else {
		b.touchElem(t, k)
		t.more[k] = insertOwned(list, b.owners, elemOwned{id: e.first, val: t.out[k]})
		e.first = o.id
		if cur := t.out[k]; cur != v {
			t.set(k, v)
		}
	}
	e.shared = true
	t.entries[k] = e
}

// dropElem removes o from the owners of element k of t.
func (b *Builder) dropElem(t *elemTable, k string, o *owner) {
	e, ok := t.entries[k]
	if !ok {
		return
	}
	if e.first != o.id {
		if !e.shared {
			return
		}
		list := t.more[k]
		if i := findOwned(list, b.owners, o); i >= 0 {
			list = append(list[:i], list[i+1:]...)
			b.setMore(t, k, e, list)
		}
		return
	}
	b.touchElem(t, k)
	if !e.shared {
		delete(t.entries, k)
		t.unset(k)
		return
	}
	list := t.more[k]
	next := list[0]
	list = append(list[:0], list[1:]...)
	e.first = next.id
	b.setMore(t, k, e, list)
	if cur := t.out[k]; cur != next.val {
		t.set(k, next.val)
	}
}

// setMore stores e, element k of t, with list the owners after its first.
func (b *Builder) setMore(t *elemTable, k string, e elemEntry, list []elemOwned) {
	if len(list) == 0 {
		delete(t.more, k)
		e.shared = false
	} else {
		t.more[k] = list
	}
	t.entries[k] = e
}

// findOwned returns the index of o in list, or -1.
func findOwned(list []elemOwned, owners []*owner, o *owner) int {
	i := sort.Search(len(list), func(i int) bool { return owners[list[i].id].name >= o.name })
	for ; i < len(list) && owners[list[i].id].name == o.name; i++ {
		if list[i].id == o.id {
			return i
		}
	}
	return -1
}

// insertOwned inserts x into list, in owner name order, before the owners of the
// same name.
func insertOwned(list []elemOwned, owners []*owner, x elemOwned) []elemOwned {
	name := owners[x.id].name
	i := sort.Search(len(list), func(i int) bool { return owners[list[i].id].name >= name })
	return insertAt(list, i, x)
}

// set puts v, the effective version of element k, into the merged ruleset.
func (t *elemTable) set(k string, v ruleset.Elem) {
	if t.out == nil {
		t.out = map[string]ruleset.Elem{}
		t.rs.Elements[t.name] = t.out
	}
	t.out[k] = v
}

// unset removes element k, which has no owner left, from the merged ruleset.
func (t *elemTable) unset(k string) {
	if t.out == nil {
		return
	}
	delete(t.out, k)
	if len(t.out) == 0 {
		delete(t.rs.Elements, t.name)
		t.out = nil
	}
}

// touchElem records the effective version of element k of t before the current
// Update changes it.
func (b *Builder) touchElem(t *elemTable, k string) {
	if b.fresh {
		return
	}
	r := elemRef{tab: t.idx, key: k}
	if _, ok := b.touchedElems[r]; ok {
		return
	}
	if b.touchedElems == nil {
		b.touchedElems = map[elemRef]struct{}{}
	}
	b.touchedElems[r] = struct{}{}
	v, had := t.out[k]
	b.elemTouches = append(b.elemTouches, elemTouch{ref: r, before: v, had: had})
}

// elemDelta adds the elements the current Update changed to d.
func (b *Builder) elemDelta(d *Delta) {
	for _, tc := range b.elemTouches {
		t := b.elemTabs[tc.ref.tab]
		cur, has := t.out[tc.ref.key]
		if tc.had == has && (!has || cur == tc.before) {
			continue
		}
		var ch Change[*ruleset.Elem]
		if tc.had {
			ch.Old = &tc.before
		}
		if has {
			ch.New = &cur
		}
		if d.Elements[t.name] == nil {
			d.Elements[t.name] = map[string]Change[*ruleset.Elem]{}
		}
		d.Elements[t.name][tc.ref.key] = ch
	}
	clear(b.elemTouches)
	b.elemTouches = b.elemTouches[:0]
	clear(b.touchedElems)
	if cap(b.elemTouches) > 1<<12 {
		b.elemTouches, b.touchedElems = nil, nil
	}
}
