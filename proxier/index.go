package proxier

import (
	"runtime/debug"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// indexGCPercent is the garbage collector's target while a Builder indexes every
// Service. Nearly all the index allocates stays live, so the heap the default
// target (100) lets grow beyond it is spent on garbage the collector would not find;
// at this target the index, not the first sync's build, would no longer set the
// process's peak memory, for more collector work during the index.
const indexGCPercent = 50

// IndexBuilder indexes every Service of st in b (Builder.Index), as the first
// sync does once the table serves, with the garbage collector's target lowered
// to indexGCPercent meanwhile. A lower target set by the process (GOGC, or
// debug.SetGCPercent) is left as it is.
func IndexBuilder(b *changeset.Builder, st *state.ClusterState) *ruleset.Ruleset {
	old := debug.SetGCPercent(indexGCPercent)
	if old < indexGCPercent { // lower already, or off (negative)
		debug.SetGCPercent(old)
	}
	defer debug.SetGCPercent(old)
	return b.Index(st)
}
