package proxier

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/conntrack"
	"github.com/nftproxy/nftproxy/proxier/metrics"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// Sync applies the current state: a full sync the first time and after a failure,
// an incremental one otherwise, and nothing when the state has not changed since the
// last successful sync.
func (p *Proxier) Sync(ctx context.Context) error { return p.SyncMode(ctx, false) }

// SyncMode is Sync, made a full one when full is true (the periodic resync that
// repairs drift): every table is rewritten, unless the node's nf_tables
// generation shows that nothing but the proxier wrote since it last was (see
// syncer.Generations). It has the signature of runner.Func.
func (p *Proxier) SyncMode(ctx context.Context, full bool) error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()

	start := p.clock.Now()
	taken := p.takeChanges()
	// The Tracker updates the state in place at the next take, once released;
	// what a later sync needs of it is kept in p.prior.
	defer p.tracker.Release(taken.State)
	st := taken.State
	p.recordInvalidObjects()
	if !full && !p.failed && p.prior != nil && !taken.Modified {
		// The events since the last sync changed nothing, and the tables are
		// current. kube-proxy counts such a sync as a partial one.
		p.observeLatency(start)
		for _, fam := range p.families {
			p.metrics.ObserveSync(fam, false, p.clock.Since(start))
			p.synced(fam, start)
		}
		return nil
	}
	if full {
		for _, s := range p.syncers {
			s.RequestFullSync()
		}
	}

	err := p.apply(ctx, st, start)
	if err != nil {
		p.failed = true
		return err
	}
	p.failed = false
	changed := p.changed // observeLatency starts a new set
	p.observeLatency(p.clock.Now())
	p.afterSync(st, changed, full)
	p.prior = &state.ClusterState{Node: st.Node, ServiceCIDRs: st.ServiceCIDRs,
		Services: map[state.ServiceName]*state.Service{}, Slices: map[state.ServiceName]map[string]*state.EndpointSlice{}}
	return nil
}

// apply builds and applies the ruleset of every family, from the state read at
// start. A family that fails does not stop the others; the error names each failed
// family. Each family's sync duration is its own build and transaction plus what
// the families share (taking the changes and the state).
func (p *Proxier) apply(ctx context.Context, st *state.ClusterState, start time.Time) error {
	shared := p.clock.Since(start)
	var errs []error
	for _, fam := range p.families {
		famStart := p.clock.Now()
		// The first sync of a family covers every Service; later ones rebuild only
		// the changed Services, so a sync costs O(what changed).
		var res syncer.Result
		var err error
		if p.built[fam] {
			rs, delta := p.builders[fam].Update(st, p.changed)
			res, err = p.syncers[fam].Apply(ctx, rs, delta)
		} else {
			res, err = p.firstSync(ctx, fam, st)
		}
		p.metrics.ObserveSync(fam, res.Full, shared+p.clock.Since(famStart))
		if res.Fallback != nil {
			p.log.Warn("sync went through nft after its netlink batch failed; later syncs use nft only",
				"family", string(fam), "err", res.Fallback)
		}
		if res.Operations > 0 {
			p.metrics.SyncOperations.WithLabelValues(metrics.Family(fam), metrics.SyncType(res.Full)).Observe(float64(res.Operations))
		}
		if err != nil {
			p.metrics.SyncFailures.WithLabelValues(metrics.Family(fam)).Inc()
			p.log.Error("sync failed", "family", string(fam), "err", err)
			errs = append(errs, err)
			continue
		}
		applied := p.syncers[fam].Applied()
		p.metrics.TableObjects.WithLabelValues(metrics.Family(fam)).Set(float64(applied.NumObjects()))
		p.synced(fam, start)
		if p.cfg.OnSynced != nil {
			p.cfg.OnSynced(fam, applied, res)
		}
		p.log.Debug("synced", "family", string(fam), "full", res.Full, "verified", res.Verified,
			"operations", res.Operations, "netlink_elements", res.NetlinkElements)
	}
	if len(errs) > 0 {
		return fmt.Errorf("proxier: sync: %w", errors.Join(errs...))
	}
	return nil
}

// synced records a successful sync of fam that applied the state read at start.
func (p *Proxier) synced(fam knftables.Family, start time.Time) {
	p.metrics.LastSyncTimestamp.WithLabelValues(metrics.Family(fam)).Set(metrics.UnixSeconds(p.clock.Now()))
	if p.cfg.Healthz != nil {
		p.cfg.Healthz.UpdatedAsOf(fam, start)
	}
}

// firstSync writes a family's table for the first time (see FirstSync).
func (p *Proxier) firstSync(ctx context.Context, fam knftables.Family, st *state.ClusterState) (syncer.Result, error) {
	res, times, err := FirstSync(ctx, p.syncers[fam], p.builders[fam], st, p.cfg.Ruleset, fam, FirstSyncHooks{})
	p.built[fam] = times.Indexed
	return res, err
}

// takeChanges takes the Tracker's state, and moves its changed Services and the
// recorded change times into the pending sets, which a successful sync observes
// and clears; what the last successful sync applied of Services newly changed
// goes into p.prior. The changed Services are all that differ between the state
// the last successful sync applied and the one returned.
func (p *Proxier) takeChanges() state.Taken {
	taken := p.tracker.TakeState()
	if p.prior != nil && taken.Prior == nil {
		p.prior = nil // not expected: this Proxier takes every state
	}
	if p.prior != nil {
		for name := range taken.Changed {
			if p.changed[name] {
				continue // p.prior has it from before a failed sync
			}
			if svc, ok := taken.Prior.Services[name]; ok {
				p.prior.Services[name] = svc
			}
			if sl, ok := taken.Prior.Slices[name]; ok {
				p.prior.Slices[name] = sl
			}
		}
	}
	maps.Copy(p.changed, taken.Changed)
	p.triggersMu.Lock()
	triggers := p.triggers
	p.triggers = map[state.ServiceName][]trigger{}
	p.pendingServices = map[state.ServiceName]bool{}
	p.pendingSlices = 0
	p.metrics.ServiceChangesPending.Set(0)
	p.metrics.EndpointChangesPending.Set(0)
	p.triggersMu.Unlock()
	for svc, ts := range triggers {
		p.pendingTriggers[svc] = append(p.pendingTriggers[svc], ts...)
	}
	return taken
}

// observeLatency records the network programming latency of every change applied
// by the sync that ended at end. Changes that changed nothing proxying sees (their
// Service is not among the changed ones) are dropped.
func (p *Proxier) observeLatency(end time.Time) {
	for svc, ts := range p.pendingTriggers {
		if !p.changed[svc] {
			continue
		}
		for _, t := range ts {
			if p.syncers[t.family] != nil {
				p.metrics.NetworkProgrammingDuration.WithLabelValues(metrics.Family(t.family)).Observe(end.Sub(t.at).Seconds())
			}
		}
	}
	p.changed = map[state.ServiceName]bool{}
	p.pendingTriggers = map[state.ServiceName][]trigger{}
}

// afterSync runs what must follow applied rules: conntrack cleanup, health-check
// node ports and the state gauges, from the Services changed since the last
// successful sync alone (the health-check node ports from every Service on the
// first and on full syncs). Their failures are logged, not returned: the rules
// are in place, and the next sync retries the node ports.
func (p *Proxier) afterSync(st *state.ClusterState, changed map[state.ServiceName]bool, full bool) {
	if p.cfg.Conntrack != nil {
		p.clearConntrack(p.frontends.Stale(p.prior, st, changed))
	}
	if p.cfg.ServiceHealth != nil {
		var err error
		if full || p.prior == nil {
			err = p.cfg.ServiceHealth.Sync(st)
		} else {
			err = p.cfg.ServiceHealth.SyncChanged(st, changed)
		}
		if err != nil {
			p.log.Error("health check node ports", "err", err)
		}
	}
	p.gauges.update(p.prior, st, changed)
	p.gauges.record(p.metrics)
}

// clearConntrack deletes the conntrack entries filters select, one cleanup per
// family as kube-proxy's reconciler, for its metrics.
func (p *Proxier) clearConntrack(stale []conntrack.Filter) {
	byFamily := map[knftables.Family][]conntrack.Filter{}
	for _, f := range stale {
		fam := knftables.IPv4Family
		if f.OrigDst.Addr().Is6() {
			fam = knftables.IPv6Family
		}
		byFamily[fam] = append(byFamily[fam], f)
	}
	for _, fam := range p.families {
		filters := byFamily[fam]
		if len(filters) == 0 {
			continue
		}
		begin := p.clock.Now()
		n, err := p.cfg.Conntrack.Clear(filters)
		p.metrics.ConntrackDuration.WithLabelValues(metrics.Family(fam)).Observe(p.clock.Since(begin).Seconds())
		p.metrics.ConntrackDeleted.WithLabelValues(metrics.Family(fam)).Add(float64(n))
		if err != nil {
			p.log.Warn("conntrack cleanup failed", "family", string(fam), "filters", len(filters), "err", err)
		} else {
			p.log.Debug("conntrack cleanup", "family", string(fam), "filters", len(filters), "deleted", n)
		}
	}
}

// recordInvalidObjects sets the invalid-object gauge from the Tracker's errors.
func (p *Proxier) recordInvalidObjects() {
	counts := map[string]int{state.KindService: 0, state.KindEndpointSlice: 0, state.KindNode: 0, state.KindServiceCIDR: 0}
	for _, err := range p.tracker.Errors() {
		var oe *state.ObjectError
		if errors.As(err, &oe) {
			counts[oe.Kind]++
		}
	}
	for kind, n := range counts {
		p.metrics.InvalidObjects.WithLabelValues(kind).Set(float64(n))
	}
}

// Tidy removes from every family's table the emptied objects incremental syncs
// kept (see syncer.WithKeepLimit), so that each table holds exactly the ruleset its
// last sync applied, without rewriting the rest as a full sync would.
func (p *Proxier) Tidy(ctx context.Context) error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	var errs []error
	for _, fam := range p.families {
		if _, err := p.syncers[fam].Tidy(ctx); err != nil {
			p.metrics.CleanupFailures.WithLabelValues(metrics.Family(fam)).Inc()
			errs = append(errs, fmt.Errorf("tidy table %s %s: %w", fam, p.cfg.Ruleset.Table, err))
		}
	}
	return errors.Join(errs...)
}

// Applied returns the ruleset the last successful sync of family wrote, or nil
// before one (or for a family the Proxier does not program).
func (p *Proxier) Applied(family knftables.Family) *ruleset.Ruleset {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	if s := p.syncers[family]; s != nil {
		return s.Applied()
	}
	return nil
}
