package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// applier drives the proxier's control plane for one table, the way the proxier's
// sync loop does: build the desired ruleset for the state, then apply it.
type applier interface {
	// apply brings the table to st. changed names the Services changed since the
	// previous call; nil means all of them (the first sync).
	apply(ctx context.Context, st *state.ClusterState, changed map[state.ServiceName]bool) (applyStats, error)
	// path names the code path measured, for the report.
	path() string
	// requestFullSync makes the next apply a full sync, as the proxier's periodic
	// resync does.
	requestFullSync()
}

// applyStats is the cost of one apply.
type applyStats struct {
	Build  time.Duration
	Sync   time.Duration
	Result syncer.Result
	// Index is the time after a first sync that the incremental builder took to
	// index every Service and have its ruleset taken over (see
	// incrementalApplier); the table was complete before it.
	Index time.Duration
	// PeakRSSWriteMB is VmHWM after a first sync's write, before the index: the
	// peak of generating the cluster, building it and encoding its elements.
	PeakRSSWriteMB float64
}

// newApplier returns the applier the benchmark measures: the incremental builder
// (changeset.Builder.Update) and Syncer.Apply of its Delta, the proxier's production
// path.
var newApplier = newIncrementalApplier

// incrementalApplier updates a changeset.Builder with the changed Services and
// applies its Delta with Syncer.Apply: O(changed) per sync. Its first sync is the
// proxier's (proxier.FirstSync): the table is written from a from-scratch
// ruleset.Build, then the Builder indexes every Service and its ruleset is taken
// over with a Syncer.Sync that diffs it against the table.
type incrementalApplier struct {
	b     *changeset.Builder
	s     *syncer.Syncer
	cfg   ruleset.Config
	built bool
}

func newIncrementalApplier(nft knftables.Interface, cfg ruleset.Config) applier {
	return &incrementalApplier{b: changeset.NewBuilder(cfg, knftables.IPv4Family), s: syncer.New(nft, syncer.WithNetlink(syncer.KernelNetlink(nil)), syncer.WithGenerations(syncer.NewGenerations())), cfg: cfg}
}

func (a *incrementalApplier) path() string { return "changeset.Builder.Update + Syncer.Apply" }

func (a *incrementalApplier) requestFullSync() { a.s.RequestFullSync() }

func (a *incrementalApplier) apply(ctx context.Context, st *state.ClusterState, changed map[state.ServiceName]bool) (applyStats, error) {
	if !a.built {
		return a.first(ctx, st)
	}
	t0 := time.Now()
	rs, delta := a.b.Update(st, changed)
	t1 := time.Now()
	res, err := a.s.Apply(ctx, rs, delta)
	return applyStats{Build: t1.Sub(t0), Sync: time.Since(t1), Result: res}, err
}

// first is the proxier's first sync (proxier.FirstSync), timed by phase.
func (a *incrementalApplier) first(ctx context.Context, st *state.ClusterState) (applyStats, error) {
	var stats applyStats
	var herr error
	res, times, err := proxier.FirstSync(ctx, a.s, a.b, st, a.cfg, knftables.IPv4Family, proxier.FirstSyncHooks{
		Written: func() { stats.PeakRSSWriteMB = vmHWM() },
		Indexed: func() { herr = writeHeapProfile() },
	})
	a.built = times.Indexed
	stats.Build, stats.Sync, stats.Index, stats.Result = times.Build, times.Write, times.Index, res
	return stats, cmp.Or(err, herr)
}

// heapProfile is the file the control child writes its heap profile to, at the
// peak of its first sync (both the from-scratch ruleset, still the applied one,
// and the Builder's, with its index, live); "" for none.
var heapProfile string

// cpuProfile is the file the control child writes the CPU profile of its first
// sync to (the from-scratch build, the sync and the Builder's index); "" for none.
var cpuProfile string

// startCPUProfile starts profiling the CPU into cpuProfile and returns the
// function that stops it and closes the file.
func startCPUProfile() (stop func(), err error) {
	if cpuProfile == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(cpuProfile), 0o755); err != nil {
		return nil, fmt.Errorf("CPU profile: %w", err)
	}
	f, err := os.Create(cpuProfile)
	if err != nil {
		return nil, fmt.Errorf("CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("CPU profile %s: %w", cpuProfile, err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// writeHeapProfile writes the heap profile to heapProfile, after a GC so that it
// shows what is live.
func writeHeapProfile() error {
	if heapProfile == "" {
		return nil
	}
	runtime.GC()
	if err := os.MkdirAll(filepath.Dir(heapProfile), 0o755); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	f, err := os.Create(heapProfile)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		return fmt.Errorf("heap profile %s: %w", heapProfile, err)
	}
	return nil
}
