package proxier

import (
	"runtime/debug"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// indexGCPercent is the garbage collector's target while a Builder indexes every
// Service. Nearly everything the index allocates stays live for the proxier's
// lifetime, so the collector finds little to free, and the headroom of the
// default target (100) only raises the process's peak. The lower target costs
// more collector work, once, during the index.
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
