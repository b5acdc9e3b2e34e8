package changeset

import "sort"

// owned is one owner's version of an object.
type owned struct {
	o   *owner
	val any
}

// ownerChunk is the most owners one chunk of an ownerList holds.
const ownerChunk = 128

// ownerList holds owners of an object in name order. Shared objects (a dnat-N
// chain, a backends map) have an owner per Service using them, tens of thousands:
// the list is cut in chunks, so that adding or removing one owner moves at most a
// chunk, not the whole list, and an incremental Update stays O(changed).
type ownerList struct {
	chunks [][]owned
	n      int
}

func (l *ownerList) len() int { return l.n }

// search returns where the owner named name is, or would go.
func (l *ownerList) search(name string) (ci, i int, found bool) {
	ci = sort.Search(len(l.chunks), func(k int) bool {
		c := l.chunks[k]
		return c[len(c)-1].o.name >= name
	})
	if ci == len(l.chunks) {
		return ci, 0, false
	}
	c := l.chunks[ci]
	i = sort.Search(len(c), func(k int) bool { return c[k].o.name >= name })
	return ci, i, i < len(c) && c[i].o.name == name
}

// find returns the version of the owner named name, or nil.
func (l *ownerList) find(name string) *owned {
	if l == nil {
		return nil
	}
	ci, i, found := l.search(name)
	if !found {
		return nil
	}
	return &l.chunks[ci][i]
}

// insert adds an owner, which must not be in the list yet.
func (l *ownerList) insert(x owned) {
	l.n++
	if k := len(l.chunks); k > 0 {
		if c := l.chunks[k-1]; c[len(c)-1].o.name < x.o.name && len(c) < ownerChunk {
			l.chunks[k-1] = append(c, x) // after every owner
			return
		}
	}
	ci, i, _ := l.search(x.o.name)
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

// remove removes the owner named name, if it is in the list.
func (l *ownerList) remove(name string) {
	if l == nil {
		return
	}
	ci, i, found := l.search(name)
	if !found {
		return
	}
	l.n--
	l.removeAt(ci, i)
}

// popFirst removes and returns the first owner; the list must not be empty.
func (l *ownerList) popFirst() owned {
	x := l.chunks[0][0]
	l.n--
	l.removeAt(0, 0)
	return x
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
