package syncer

import (
	"hash/maphash"
	"runtime"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// seal is what a Syncer keeps of its applied ruleset after Seal: enough to tell
// whether another ruleset is the same, without its elements.
type seal struct {
	structure string
	elements  map[string]elementSum
}

// elementSum sums up the elements of one set or map: how many, and the sum of
// their hashes, which does not depend on their order.
type elementSum struct {
	n   int
	sum uint64
}

// hashSeed seeds the element hashes of seals; they are compared within one
// process only.
var hashSeed = maphash.MakeSeed()

// elementSums returns the elementSum of each set and map of rs with elements.
func elementSums(rs *ruleset.Ruleset) map[string]elementSum {
	sums := make(map[string]elementSum, len(rs.Elements))
	for name, es := range rs.Elements {
		if len(es) == 0 {
			continue
		}
		var s elementSum
		var h maphash.Hash
		h.SetSeed(hashSeed)
		for key, e := range es {
			h.Reset()
			h.WriteString(key)
			h.WriteByte(0)
			h.WriteString(e.Data)
			s.n++
			s.sum += h.Sum64()
		}
		sums[name] = s
	}
	return sums
}

// Seal lets the Syncer forget the elements of the ruleset it applied last, so
// that the caller's next ruleset need not share memory with it: it keeps a digest
// of the chains, rules, sets and maps and a sum of the elements of each set and
// map instead. The next Sync of a ruleset with the same digest and sums takes it
// over as the applied one without writing anything; any other sync runs as a full
// one. The proxier seals after the first sync of a from-scratch ruleset.Build,
// before its Builder indexes every Service into a ruleset of its own: at 50,000
// Services the two rulesets were live at once at the first sync's peak.
func (s *Syncer) Seal() {
	if s.applied == nil || s.live || s.full {
		return
	}
	s.sealed = &seal{structure: s.structureOf(s.applied), elements: elementSums(s.applied)}
	n := 0
	for _, es := range s.applied.Elements {
		n += len(es)
	}
	s.applied = nil
	if n >= sealCollect {
		// Collected now, the ruleset's memory is reused by the next one; left to the
		// pacer, whose heap goal was set while it was live, the next ruleset grows
		// into fresh memory on top of it.
		runtime.GC()
	}
}

// sealCollect is the element count from which Seal runs a garbage collection.
const sealCollect = 100_000

// takeOver makes desired the applied ruleset when it matches the seal, and
// reports whether it did. Either way the seal is gone; when desired does not
// match, the next sync is a full one.
func (s *Syncer) takeOver(desired *ruleset.Ruleset) bool {
	sl := s.sealed
	s.sealed = nil
	if s.full || sl.structure != s.structureOf(desired) || !sameSums(sl.elements, elementSums(desired)) {
		s.full = true
		return false
	}
	s.applied, s.live = desired, false
	return true
}

// sameSums reports whether a and b hold the same sums.
func sameSums(a, b map[string]elementSum) bool {
	if len(a) != len(b) {
		return false
	}
	for name, x := range a {
		if y, ok := b[name]; !ok || x != y {
			return false
		}
	}
	return true
}
