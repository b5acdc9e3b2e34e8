package sim

import (
	"bytes"
	"hash/maphash"
	"sort"
	"strconv"
	"strings"
	"time"
)

// setDef is a named or anonymous set or map: its declaration, elements and lookup index.
//
// Element bytes (key bounds, data, comments) live in one arena per set and elements are
// pointer-free records of offsets, so that a ruleset of hundreds of thousands of
// elements is a handful of heap objects for the garbage collector to scan.
type setDef struct {
	name     string // "" for anonymous sets
	table    *table
	key      fieldTypes
	data     fieldTypes // nil for sets; {nftdata.VerdictType} for verdict maps
	isMap    bool
	interval bool
	timeout  time.Duration // default element timeout (0: none)
	comment  string
	deleted  bool // removed by "delete set" after rules referred to it
	// syms are the symbolic constants of each key field (anonymous sets of icmp
	// types, tcp flags, ...), nil when none.
	syms []symbols

	keyW, dataW int
	arena       []byte
	elems       []elem
	verdicts    []*verdict
	verdictIx   map[string]int32 // "kind chain" -> index in verdicts, while building
	live        []*verdict       // the verdicts of the elements left after build
	byKey       map[string]int32 // lo+hi -> index in elems, while building
	idx         *setIndex
}

// elem is one element of a set or map, as offsets into its set's arena: the key's low
// bound at off, its high bound right after, then the map data.
type elem struct {
	off        int32
	verdict    int32 // index in setDef.verdicts; -1 for none
	cOff, cLen int32 // comment bytes in the arena
	timeout    time.Duration
	expires    time.Duration // from a listing: remaining lifetime when listed
	deleted    bool
}

// elemSpec is a parsed element before it is stored.
type elemSpec struct {
	lo, hi  []byte
	data    []byte
	verdict *verdict
	refCtx  CompileError // where the verdict's chain was named
	comment string
	timeout time.Duration
	expires time.Duration
}

func (s *setDef) lo(e *elem) []byte { return s.arena[e.off : int(e.off)+s.keyW] }
func (s *setDef) hi(e *elem) []byte { return s.arena[int(e.off)+s.keyW : int(e.off)+2*s.keyW] }
func (s *setDef) dataOf(e *elem) []byte {
	o := int(e.off) + 2*s.keyW
	return s.arena[o : o+s.dataW]
}

func (s *setDef) verdictOf(e *elem) *verdict {
	if e.verdict < 0 {
		return nil
	}
	return s.verdicts[e.verdict]
}

func (s *setDef) commentOf(e *elem) string {
	if e.cLen == 0 {
		return ""
	}
	return string(s.arena[e.cOff : e.cOff+e.cLen])
}

func (s *setDef) displayName() string {
	if s.name == "" {
		return "anonymous set"
	}
	return "@" + s.name
}

// addElem stores an element; a re-added key replaces the old one, as knftables.Fake
// does. It reports whether the element brought a verdict not seen before in this set
// (whose chain reference the caller must resolve).
func (s *setDef) addElem(sp elemSpec) (newVerdict *verdict) {
	if s.keyW == 0 {
		s.keyW, s.dataW = s.key.width(), s.data.width()
	}
	e := elem{off: int32(len(s.arena)), verdict: -1}
	s.arena = append(s.arena, sp.lo...)
	s.arena = append(s.arena, sp.hi...)
	data := sp.data
	if len(data) != s.dataW {
		data = make([]byte, s.dataW)
	}
	s.arena = append(s.arena, data...)
	if sp.comment != "" {
		e.cOff, e.cLen = int32(len(s.arena)), int32(len(sp.comment))
		s.arena = append(s.arena, sp.comment...)
	}
	e.timeout, e.expires = sp.timeout, sp.expires
	if v := sp.verdict; v != nil {
		k := strconv.Itoa(int(v.kind)) + " " + v.chainName
		if s.verdictIx == nil {
			s.verdictIx = map[string]int32{}
		}
		i, ok := s.verdictIx[k]
		if !ok {
			i = int32(len(s.verdicts))
			s.verdictIx[k] = i
			s.verdicts = append(s.verdicts, v)
			newVerdict = v
		}
		e.verdict = i
	}
	if s.byKey == nil {
		s.byKey = map[string]int32{}
	}
	k := string(sp.lo) + "\x00" + string(sp.hi)
	if i, ok := s.byKey[k]; ok {
		s.elems[i] = e
		return newVerdict
	}
	s.byKey[k] = int32(len(s.elems))
	s.elems = append(s.elems, e)
	return newVerdict
}

func (s *setDef) deleteElem(lo, hi []byte) bool {
	k := string(lo) + "\x00" + string(hi)
	i, ok := s.byKey[k]
	if !ok {
		return false
	}
	delete(s.byKey, k)
	s.elems[i].deleted = true
	return true
}

func (s *setDef) flush() {
	s.elems = nil
	s.arena = nil
	s.byKey = nil
}

// build drops deleted elements and builds the lookup index.
func (s *setDef) build() {
	if s.keyW == 0 {
		s.keyW, s.dataW = s.key.width(), s.data.width()
	}
	live := s.elems[:0]
	for _, e := range s.elems {
		if !e.deleted {
			live = append(live, e)
		}
	}
	s.elems = live
	s.byKey = nil
	s.verdictIx = nil
	used := make([]bool, len(s.verdicts))
	s.live = nil
	for _, e := range s.elems {
		if e.verdict >= 0 && !used[e.verdict] {
			used[e.verdict] = true
			s.live = append(s.live, s.verdicts[e.verdict])
		}
	}
	s.idx = newSetIndex(s)
}

// elemText renders element i as nft lists it.
func (s *setDef) elemText(i int32) string {
	e := &s.elems[i]
	lo, hi := s.lo(e), s.hi(e)
	var b strings.Builder
	off := 0
	for f, t := range s.key {
		if f > 0 {
			b.WriteString(" . ")
		}
		b.WriteString(t.FormatRange(lo[off:off+t.Width()], hi[off:off+t.Width()]))
		off += t.Width()
	}
	if c := s.commentOf(e); c != "" {
		b.WriteString(" comment " + strconv.Quote(c))
	}
	if s.isMap {
		b.WriteString(" : ")
		if v := s.verdictOf(e); v != nil {
			b.WriteString(v.String())
		} else {
			b.WriteString(formatFields(s.data, s.dataOf(e)))
		}
	}
	return b.String()
}

// setIndex finds the element matching a key in time independent of the number of
// elements: exact elements are in an open-addressing hash table on the concatenated key
// (pointer-free, comparing against the arena); elements with a range or prefix in any
// field are in a rangeNode tree, which splits each field's value space into elementary
// segments and descends field by field with a binary search.
type setIndex struct {
	s      *setDef
	offs   []int
	seed   maphash.Seed
	slots  []int32 // element index + 1; 0 is empty
	mask   uint64
	ranged *rangeNode
}

// rangeNode indexes elements by one field of their key. Segment i covers
// [starts[i], starts[i+1]); next[i] indexes the elements covering it by the following
// field, or, for the last field, leaf[i] is the first such element (-1 for none).
type rangeNode struct {
	field  int
	starts [][]byte
	next   []*rangeNode
	leaf   []int32
}

// indexSeed seeds the hash of every set index.
var indexSeed = maphash.MakeSeed()

func newSetIndex(s *setDef) *setIndex {
	ix := &setIndex{s: s, seed: indexSeed}
	off := 0
	for _, t := range s.key {
		ix.offs = append(ix.offs, off)
		off += t.Width()
	}
	var ranged []int32
	exact := 0
	for i := range s.elems {
		e := &s.elems[i]
		if bytes.Equal(s.lo(e), s.hi(e)) {
			exact++
		} else {
			ranged = append(ranged, int32(i))
		}
	}
	size := 8
	for size < 2*exact {
		size <<= 1
	}
	ix.slots = make([]int32, size)
	ix.mask = uint64(size - 1)
	for i := range s.elems {
		e := &s.elems[i]
		lo := s.lo(e)
		if !bytes.Equal(lo, s.hi(e)) {
			continue
		}
		if ix.findExact(lo) >= 0 {
			continue // a duplicate key: the first one wins
		}
		h := maphash.Bytes(ix.seed, lo) & ix.mask
		for ix.slots[h] != 0 {
			h = (h + 1) & ix.mask
		}
		ix.slots[h] = int32(i) + 1
	}
	if len(ranged) > 0 {
		memo := map[string]*rangeNode{}
		ix.ranged = ix.buildNode(0, ranged, memo)
	}
	return ix
}

func (ix *setIndex) findExact(key []byte) int32 {
	s := ix.s
	h := maphash.Bytes(ix.seed, key) & ix.mask
	for {
		v := ix.slots[h]
		if v == 0 {
			return -1
		}
		if bytes.Equal(s.lo(&s.elems[v-1]), key) {
			return v - 1
		}
		h = (h + 1) & ix.mask
	}
}

func (ix *setIndex) field(b []byte, f int) []byte {
	return b[ix.offs[f] : ix.offs[f]+ix.s.key[f].Width()]
}

// buildNode builds the index of members (element indices, ascending) by field f.
func (ix *setIndex) buildNode(f int, members []int32, memo map[string]*rangeNode) *rangeNode {
	sig := sigOf(f, members)
	if n, ok := memo[sig]; ok {
		return n
	}
	s := ix.s
	type event struct {
		at    []byte
		start bool
		e     int32
	}
	var evs []event
	points := map[string][]byte{}
	for _, m := range members {
		lo := ix.field(s.lo(&s.elems[m]), f)
		hi := ix.field(s.hi(&s.elems[m]), f)
		evs = append(evs, event{at: lo, start: true, e: m})
		points[string(lo)] = lo
		if after, ok := incr(hi); ok {
			evs = append(evs, event{at: after, start: false, e: m})
			points[string(after)] = after
		}
	}
	starts := make([][]byte, 0, len(points))
	for _, p := range points {
		starts = append(starts, p)
	}
	sort.Slice(starts, func(i, j int) bool { return bytes.Compare(starts[i], starts[j]) < 0 })
	sort.Slice(evs, func(i, j int) bool { return bytes.Compare(evs[i].at, evs[j].at) < 0 })
	n := &rangeNode{field: f, starts: starts}
	last := f == len(s.key)-1
	active := map[int32]bool{}
	ei := 0
	for _, st := range starts {
		for ei < len(evs) && bytes.Equal(evs[ei].at, st) {
			if evs[ei].start {
				active[evs[ei].e] = true
			} else {
				delete(active, evs[ei].e)
			}
			ei++
		}
		cover := make([]int32, 0, len(active))
		for m := range active {
			cover = append(cover, m)
		}
		sort.Slice(cover, func(i, j int) bool { return cover[i] < cover[j] })
		if last {
			first := int32(-1)
			if len(cover) > 0 {
				first = cover[0]
			}
			n.leaf = append(n.leaf, first)
		} else {
			var child *rangeNode
			if len(cover) > 0 {
				child = ix.buildNode(f+1, cover, memo)
			}
			n.next = append(n.next, child)
		}
	}
	memo[sig] = n
	return n
}

func sigOf(f int, members []int32) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(f))
	for _, m := range members {
		b.WriteByte(',')
		b.WriteString(strconv.Itoa(int(m)))
	}
	return b.String()
}

// lookup returns the index of the element matching key, or -1. An exact element wins
// over ranged ones; among ranged ones the first added wins.
func (ix *setIndex) lookup(key []byte) int32 {
	if len(key) != ix.s.keyW {
		return -1
	}
	if i := ix.findExact(key); i >= 0 {
		return i
	}
	n := ix.ranged
	for n != nil {
		v := ix.field(key, n.field)
		seg := sort.Search(len(n.starts), func(i int) bool { return bytes.Compare(n.starts[i], v) > 0 }) - 1
		if seg < 0 {
			return -1
		}
		if n.leaf != nil {
			return n.leaf[seg]
		}
		n = n.next[seg]
	}
	return -1
}
