package proxier

import (
	"cmp"
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

// SyncMode is Sync, forced to rewrite every table when full is true (the periodic
// resync that repairs drift). It has the signature of runner.Func.
func (p *Proxier) SyncMode(ctx context.Context, full bool) error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()

	start := p.clock.Now()
	p.takeChanges()
	st := p.tracker.State()
	p.recordInvalidObjects()
	if !full && !p.failed && st == p.applied {
		// The Tracker returns the same snapshot until something changes: the
		// events since the last sync changed nothing, and the tables are current.
		p.observeLatency(start)
		if p.cfg.Healthz != nil {
			p.cfg.Healthz.UpdatedAsOf(start)
		}
		return nil
	}
	if full {
		for _, s := range p.syncers {
			s.RequestFullSync()
		}
	}

	anyFull, err := p.apply(ctx, st)
	p.metrics.SyncDuration.WithLabelValues(metrics.SyncType(anyFull)).Observe(p.clock.Since(start).Seconds())
	if err != nil {
		p.failed = true
		return err
	}
	p.failed = false
	end := p.clock.Now()
	p.metrics.LastSyncTimestamp.Set(float64(end.UnixNano()) / 1e9)
	if p.cfg.Healthz != nil {
		p.cfg.Healthz.UpdatedAsOf(start)
	}
	p.observeLatency(end)
	p.afterSync(st)
	p.applied = st
	return nil
}

// apply builds and applies the ruleset of every family. A family that fails does not
// stop the others; the error names each failed family.
func (p *Proxier) apply(ctx context.Context, st *state.ClusterState) (anyFull bool, err error) {
	var errs []error
	for _, fam := range p.families {
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
		anyFull = anyFull || res.Full
		if res.Fallback != nil {
			p.log.Warn("sync went through nft after its netlink batch failed; later syncs use nft only",
				"family", string(fam), "err", res.Fallback)
		}
		if res.Operations > 0 {
			p.metrics.SyncOperations.WithLabelValues(string(fam), metrics.SyncType(res.Full)).Observe(float64(res.Operations))
		}
		if err != nil {
			p.metrics.SyncFailures.WithLabelValues(string(fam)).Inc()
			p.log.Error("sync failed", "family", string(fam), "err", err)
			errs = append(errs, err)
			continue
		}
		applied := p.syncers[fam].Applied()
		p.metrics.TableObjects.WithLabelValues(string(fam)).Set(float64(applied.NumObjects()))
		if p.cfg.OnSynced != nil {
			p.cfg.OnSynced(fam, applied, res)
		}
		p.log.Debug("synced", "family", string(fam), "full", res.Full, "operations", res.Operations, "netlink_elements", res.NetlinkElements)
	}
	if len(errs) > 0 {
		return anyFull, fmt.Errorf("proxier: sync: %w", errors.Join(errs...))
	}
	return anyFull, nil
}

// firstSync writes a family's table for the first time. It programs the kernel
// from a from-scratch ruleset.Build, which takes less time than the Builder's
// first Update as it keeps no index of which Service owns which object (at 50,000
// Services, 2.3-2.5 s against 3.3-4.0 s, each in a fresh process). Only then does
// the Builder index every Service, and the Syncer diffs the Builder's ruleset
// against the table it just wrote, which normally takes no nft operation. Later
// syncs apply the Builder's deltas.
func (p *Proxier) firstSync(ctx context.Context, fam knftables.Family, st *state.ClusterState) (syncer.Result, error) {
	s := p.syncers[fam]
	res, err := s.Sync(ctx, ruleset.Build(st, p.cfg.Ruleset, fam))
	if err != nil {
		return res, err
	}
	rs, _ := p.builders[fam].Update(st, nil)
	p.built[fam] = true
	adopt, err := s.Sync(ctx, rs)
	res.Operations += adopt.Operations
	res.NetlinkElements += adopt.NetlinkElements
	res.Deleted = res.Deleted || adopt.Deleted
	res.Fallback = cmp.Or(res.Fallback, adopt.Fallback)
	res.AffinityMoves = append(res.AffinityMoves, adopt.AffinityMoves...)
	return res, err
}

// takeChanges moves the Tracker's changed Services and the recorded change times
// into the pending sets, which a successful sync observes and clears.
func (p *Proxier) takeChanges() {
	maps.Copy(p.changed, p.tracker.TakeChanged())
	p.triggersMu.Lock()
	triggers := p.triggers
	p.triggers = map[state.ServiceName][]time.Time{}
	p.triggersMu.Unlock()
	for svc, ts := range triggers {
		p.pendingTriggers[svc] = append(p.pendingTriggers[svc], ts...)
	}
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
			p.metrics.NetworkProgrammingDuration.Observe(end.Sub(t).Seconds())
		}
	}
	p.changed = map[state.ServiceName]bool{}
	p.pendingTriggers = map[state.ServiceName][]time.Time{}
}

// afterSync runs what must follow applied rules: conntrack cleanup, health-check
// node ports and the state gauges. Their failures are logged, not returned: the
// rules are in place, and the next sync retries the node ports.
func (p *Proxier) afterSync(st *state.ClusterState) {
	if p.cfg.Conntrack != nil {
		if filters := conntrack.Stale(p.applied, st); len(filters) > 0 {
			n, err := p.cfg.Conntrack.Clear(filters)
			p.metrics.ConntrackCleared.Add(float64(n))
			if err != nil {
				p.log.Warn("conntrack cleanup failed", "filters", len(filters), "err", err)
			} else {
				p.log.Debug("conntrack cleanup", "filters", len(filters), "deleted", n)
			}
		}
	}
	if p.cfg.ServiceHealth != nil {
		if err := p.cfg.ServiceHealth.Sync(st); err != nil {
			p.log.Error("health check node ports", "err", err)
		}
	}
	p.recordStateGauges(st)
}

// recordInvalidObjects sets the invalid-object gauge from the Tracker's errors.
func (p *Proxier) recordInvalidObjects() {
	counts := map[string]int{state.KindService: 0, state.KindEndpointSlice: 0, state.KindNode: 0}
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

// recordStateGauges sets the per-family Service and endpoint gauges and the count of
// Service ports with a Local policy and no local endpoint.
func (p *Proxier) recordStateGauges(st *state.ClusterState) {
	for _, fam := range p.families {
		svcs, eps := familyCounts(st, fam == "ip6")
		p.metrics.Services.WithLabelValues(string(fam)).Set(float64(svcs))
		p.metrics.Endpoints.WithLabelValues(string(fam)).Set(float64(eps))
	}
	internal, external := withoutLocalEndpoints(st)
	p.metrics.ServicesWithoutLocalEndpoints.WithLabelValues(metrics.PolicyInternal).Set(float64(internal))
	p.metrics.ServicesWithoutLocalEndpoints.WithLabelValues(metrics.PolicyExternal).Set(float64(external))
}

// familyCounts returns the number of Services with a ClusterIP of the family (those
// the family's ruleset serves) and of distinct endpoint address:port pairs of it.
func familyCounts(st *state.ClusterState, ipv6 bool) (services, endpoints int) {
	for _, svc := range st.Services {
		for _, a := range svc.ClusterIPs {
			if a.Is6() == ipv6 {
				services++
				break
			}
		}
	}
	seen := map[string]bool{}
	for _, slices := range st.Slices {
		for _, sl := range slices {
			if sl.IPv6 != ipv6 {
				continue
			}
			for _, sp := range sl.Ports {
				for _, e := range sl.Endpoints {
					seen[fmt.Sprintf("%s/%s/%d", e.Address, sp.Protocol, sp.Port)] = true
				}
			}
		}
	}
	return services, len(seen)
}

// withoutLocalEndpoints counts the Service ports under an internal (respectively
// external) Local traffic policy that have usable endpoints, none of them on this
// node: traffic of that kind reaching this node is dropped.
func withoutLocalEndpoints(st *state.ClusterState) (internal, external int) {
	for _, svc := range st.Services {
		if !svc.InternalPolicyLocal && !svc.ExternalPolicyLocal {
			continue
		}
		hasExternal := len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0
		for _, port := range svc.Ports {
			sel := state.Select(svc, st.Endpoints(svc, port), st.Node)
			if len(sel.Cluster) == 0 || len(sel.Local) > 0 {
				continue
			}
			if svc.InternalPolicyLocal {
				internal++
			}
			if svc.ExternalPolicyLocal && (hasExternal || port.NodePort != 0) {
				external++
			}
		}
	}
	return internal, external
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
