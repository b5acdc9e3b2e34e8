package proxier

import (
	"cmp"
	"context"
	"runtime/debug"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
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

// writeGC lowers the garbage collector's target for the first sync's from-scratch
// build and write (writeGCPercent), and returns the function that restores it.
func writeGC() (restore func()) { return lowerGC(writeGCPercent) }

// IndexBuilder indexes every Service of st in b (Builder.Index), as the first
// sync does once the table serves, with the garbage collector's target lowered
// to indexGCPercent meanwhile.
func IndexBuilder(b *changeset.Builder, st *state.ClusterState) *ruleset.Ruleset {
	defer lowerGC(indexGCPercent)()
	return b.Index(st)
}

// FirstSyncHooks are called between the phases of FirstSync (nil: not called).
type FirstSyncHooks struct {
	// Written runs once the table is written, before the Builder indexes.
	Written func()
	// Indexed runs once the Builder has indexed, before the Syncer takes its
	// ruleset over.
	Indexed func()
}

// FirstSyncTimes are the phases of one FirstSync.
type FirstSyncTimes struct {
	// Build is the from-scratch ruleset.Build; Write its sync into the table.
	Build, Write time.Duration
	// Index is the Builder's index of every Service and the Syncer's taking its
	// ruleset over, while the table already serves.
	Index time.Duration
	// Indexed is true once the Builder has indexed every Service: later syncs
	// apply its deltas, even if taking its ruleset over failed.
	Indexed bool
}

// FirstSync writes a family's table for the first time, through s, and readies b
// for the incremental syncs after it. It programs the kernel from a from-scratch
// ruleset.Build of st, which takes less time than the Builder's first Update as
// it keeps no index of which Service owns which object. Only then does the
// Builder index every Service; the Syncer, sealed in between so that the two
// rulesets are not live at once, takes the Builder's ruleset over when it matches
// the table it just wrote, which normally takes no nft operation. The garbage
// collector's targets are lowered meanwhile (writeGCPercent, indexGCPercent), as
// the first sync sets the process's peak memory. The proxier's first sync of each
// family, and the bench's, are this.
func FirstSync(ctx context.Context, s *syncer.Syncer, b *changeset.Builder, st *state.ClusterState, cfg ruleset.Config,
	fam knftables.Family, hooks FirstSyncHooks) (syncer.Result, FirstSyncTimes, error) {
	var times FirstSyncTimes
	restore := writeGC()
	t0 := time.Now()
	pure := ruleset.Build(st, cfg, fam)
	t1 := time.Now()
	res, err := s.Sync(ctx, pure)
	t2 := time.Now()
	restore()
	times.Build, times.Write = t1.Sub(t0), t2.Sub(t1)
	if err != nil {
		return res, times, err
	}
	if hooks.Written != nil {
		hooks.Written()
	}
	s.Seal() // the Builder's ruleset need not share the heap with this one
	rs := IndexBuilder(b, st)
	times.Indexed = true
	if hooks.Indexed != nil {
		hooks.Indexed()
	}
	adopt, err := s.Sync(ctx, rs)
	times.Index = time.Since(t2)
	res.Operations += adopt.Operations
	res.NetlinkElements += adopt.NetlinkElements
	res.Deleted = res.Deleted || adopt.Deleted
	res.Fallback = cmp.Or(res.Fallback, adopt.Fallback)
	res.AffinityMoves = append(res.AffinityMoves, adopt.AffinityMoves...)
	return res, times, err
}
