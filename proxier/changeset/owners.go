package changeset

import (
	"sort"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// owned is one owner of an object after its first: the owner by number, and its
// version by index in the list's versions.
type owned struct {
	id, ver int32
}

// version is a version of an object and how many owners of a list have it.
type version struct {
	val any
	n   int32
}

// ownerChunk is the most owners one chunk of an ownerList holds.
const ownerChunk = 128

// ownerList holds owners of an object in name order, with their versions. Shared
// objects (a dnat-N chain, a backends map) have an owner per Service using them,
// hundreds of thousands in all: the list holds each by number and its version by
// index, the versions once each (the owners of a shared object nearly always have
// the same one), and is cut in chunks, so that adding or removing one owner moves
// at most a chunk, not the whole list, and an incremental Update stays
// O(changed). Its methods take the Builder's owners by number.
type ownerList struct {
	chunks [][]owned
	n      int
	vers   []version
}

func (l *ownerList) len() int { return l.n }

// search returns where the first owner named name is, or would go.
func (l *ownerList) search(tab []*owner, name string) (ci, i int, found bool) {
	ci = sort.Search(len(l.chunks), func(k int) bool {
		c := l.chunks[k]
		return tab[c[len(c)-1].id].name >= name
	})
	if ci == len(l.chunks) {
		return ci, 0, false
	}
	c := l.chunks[ci]
	i = sort.Search(len(c), func(k int) bool { return tab[c[k].id].name >= name })
	return ci, i, i < len(c) && tab[c[i].id].name == name
}

// locate returns where o is in the list, if it is.
func (l *ownerList) locate(tab []*owner, o *owner) (ci, i int, found bool) {
	if l == nil {
		return 0, 0, false
	}
	ci, i, found = l.search(tab, o.name)
	// Two owners may share a name ("a/b" + "c" and "a" + "b/c"): look through them.
	for found {
		if x := l.chunks[ci][i]; x.id == o.id {
			return ci, i, true
		}
		if i++; i == len(l.chunks[ci]) {
			ci, i = ci+1, 0
		}
		found = ci < len(l.chunks) && tab[l.chunks[ci][i].id].name == o.name
	}
	return 0, 0, false
}

// intern returns the index of version v in the list, adding it.
func (l *ownerList) intern(v any) int32 {
	free := -1
	for i, x := range l.vers {
		if x.n == 0 {
			free = i
		} else if x.val == v || ruleset.EqualObjects(x.val, v) {
			l.vers[i].n++
			return int32(i)
		}
	}
	if free < 0 {
		free = len(l.vers)
		l.vers = append(l.vers, version{})
	}
	l.vers[free] = version{val: v, n: 1}
	return int32(free)
}

// release drops one owner's use of version ver.
func (l *ownerList) release(ver int32) {
	if l.vers[ver].n--; l.vers[ver].n == 0 {
		l.vers[ver].val = nil
	}
}

// insert adds o, with version v, which must not be in the list yet, before the
// owners of the same name.
func (l *ownerList) insert(tab []*owner, o *owner, v any) {
	x := owned{id: o.id, ver: l.intern(v)}
	l.n++
	if k := len(l.chunks); k > 0 {
		if c := l.chunks[k-1]; tab[c[len(c)-1].id].name < o.name && len(c) < ownerChunk {
			l.chunks[k-1] = append(c, x) // after every owner
			return
		}
	}
	ci, i, _ := l.search(tab, o.name)
	if ci == len(l.chunks) {
		// After every owner: appended, the common case of a first build, which
		// goes through the Services in order.
		if ci == 0 || len(l.chunks[ci-1]) >= ownerChunk {
			l.chunks = append(l.chunks, append(make([]owned, 0, 8), x))
			return
		}
		ci--
		i = len(l.chunks[ci])
	}
	c := insertAt(l.chunks[ci], i, x)
	if len(c) <= ownerChunk {
		l.chunks[ci] = c
		return
	}
	// Split the full chunk in two halves.
	half := len(c) / 2
	tail := append(make([]owned, 0, ownerChunk), c[half:]...)
	clear(c[half:])
	l.chunks[ci] = c[:half]
	l.chunks = insertAt(l.chunks, ci+1, tail)
}

// set makes v the version of o, when o is in the list, and reports whether it is.
func (l *ownerList) set(tab []*owner, o *owner, v any) bool {
	ci, i, found := l.locate(tab, o)
	if !found {
		return false
	}
	x := &l.chunks[ci][i]
	if cur := l.vers[x.ver].val; cur != v && !ruleset.EqualObjects(cur, v) {
		l.release(x.ver)
		x.ver = l.intern(v)
	}
	return true
}

// remove removes o, if it is in the list.
func (l *ownerList) remove(tab []*owner, o *owner) {
	ci, i, found := l.locate(tab, o)
	if !found {
		return
	}
	l.release(l.chunks[ci][i].ver)
	l.n--
	l.removeAt(ci, i)
}

// popFirst removes the first owner, which the list must have, and returns it and
// its version.
func (l *ownerList) popFirst(tab []*owner) (*owner, any) {
	x := l.chunks[0][0]
	v := l.vers[x.ver].val
	l.release(x.ver)
	l.n--
	l.removeAt(0, 0)
	return tab[x.id], v
}

func (l *ownerList) removeAt(ci, i int) {
	c := l.chunks[ci]
	copy(c[i:], c[i+1:])
	c[len(c)-1] = owned{}
	c = c[:len(c)-1]
	if len(c) > 0 {
		l.chunks[ci] = c
		return
	}
	copy(l.chunks[ci:], l.chunks[ci+1:])
	l.chunks[len(l.chunks)-1] = nil
	l.chunks = l.chunks[:len(l.chunks)-1]
}

// insertAt inserts x at index i of s.
func insertAt[T any](s []T, i int, x T) []T {
	var zero T
	s = append(s, zero)
	copy(s[i+1:], s[i:])
	s[i] = x
	return s
}
