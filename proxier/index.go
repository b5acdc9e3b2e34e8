package proxier

import (
	"runtime/debug"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// The garbage collector's targets during the first sync, which sets the process's
// peak memory: the default target (100) lets the heap grow to twice what is live
// before each collection, and the first sync is when the most is live.
const (
	// writeGCPercent holds while the from-scratch ruleset is built and written.
	// The build leaves much garbage behind it, so a moderate target frees most of
	// the headroom for a little more collector work.
	writeGCPercent = 50
	// indexGCPercent holds while the Builder indexes every Service. Nearly
	// everything the index allocates stays live for the proxier's lifetime, so
	// the collector finds little to free and headroom is all that a higher target
	// buys; the lower one costs more collector work, once.
	indexGCPercent = 25
)

// lowerGC lowers the garbage collector's target to pct and returns the function
// that restores the process's own. A lower target set by the process (GOGC, or
// debug.SetGCPercent), or the collector off, is left as it is.
func lowerGC(pct int) (restore func()) {
	old := debug.SetGCPercent(pct)
	if old < pct { // lower already, or off (negative)
		debug.SetGCPercent(old)
	}
	return func() { debug.SetGCPercent(old) }
}

// WriteGC lowers the garbage collector's target for the first sync's from-scratch
// build and write (writeGCPercent), and returns the function that restores it.
func WriteGC() (restore func()) { return lowerGC(writeGCPercent) }

// IndexBuilder indexes every Service of st in b (Builder.Index), as the first
// sync does once the table serves, with the garbage collector's target lowered
// to indexGCPercent meanwhile.
func IndexBuilder(b *changeset.Builder, st *state.ClusterState) *ruleset.Ruleset {
	defer lowerGC(indexGCPercent)()
	return b.Index(st)
}
