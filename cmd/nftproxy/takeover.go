package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/metrics"
	"github.com/nftproxy/nftproxy/proxier/runner"
	"github.com/nftproxy/nftproxy/proxier/takeover"
)

// Taking a node over from kube-proxy: once nftproxy's first sync has put its rules in
// place in every family, what kube-proxy left is removed, so that the node is never
// without rules (--cleanup-table-after-sync, --cleanup-kube-proxy-iptables).

// iptablesCleanupAttempts bounds the runs of --cleanup-kube-proxy-iptables that fail:
// each lists every table of both backends, which is not to be repeated at every sync
// when something (a rule of another program jumping into kube-proxy's chains) keeps
// failing.
const iptablesCleanupAttempts = 3

// afterSyncStep is a cleanup run after a successful sync until it succeeds, at most
// attempts times when attempts > 0.
type afterSyncStep struct {
	name     string
	run      func(context.Context) error
	attempts int
	tries    int
	done     bool
}

// takeoverSteps returns the cleanups o asks for.
func takeoverSteps(o *Options, d deps, m *metrics.Metrics, log *slog.Logger) []*afterSyncStep {
	var steps []*afterSyncStep
	if table := o.CleanupAfterSync; table != "" {
		steps = append(steps, &afterSyncStep{name: "--cleanup-table-after-sync", run: func(ctx context.Context) error {
			if err := proxier.Cleanup(ctx, d.newNFT, table); err != nil {
				return err
			}
			log.Info("synced, then deleted the tables of --cleanup-table-after-sync", "table", table)
			return nil
		}})
	}
	if o.CleanupKubeProxyIptables {
		steps = append(steps, iptablesStep(d, m, log))
	}
	return steps
}

// iptablesStep is --cleanup-kube-proxy-iptables: its failures are counted in
// nftproxy_kube_proxy_iptables_cleanup_failures_total.
func iptablesStep(d deps, m *metrics.Metrics, log *slog.Logger) *afterSyncStep {
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metrics.Namespace, Name: "kube_proxy_iptables_cleanup_failures_total",
		Help: "Failed steps of the removal of kube-proxy's iptables-mode rules and chains (--cleanup-kube-proxy-iptables).",
	}, []string{"backend", "ip_family"})
	m.Registry.MustRegister(failures)
	for _, b := range []string{takeover.BackendNft, takeover.BackendLegacy} {
		for _, f := range []string{metrics.IPv4, metrics.IPv6} {
			failures.WithLabelValues(b, f)
		}
	}
	clean := d.iptablesCleanup
	if clean == nil {
		clean = func(context.Context, takeover.Config) takeover.Result {
			log.Warn("--cleanup-kube-proxy-iptables: no iptables cleanup in this build of the daemon")
			return takeover.Result{}
		}
	}
	cfg := takeover.Config{Log: log, Failed: func(backend, family string) { failures.WithLabelValues(backend, family).Inc() }}
	return &afterSyncStep{name: "--cleanup-kube-proxy-iptables", attempts: iptablesCleanupAttempts, run: func(ctx context.Context) error {
		res := clean(ctx, cfg)
		if res.Failures > 0 {
			return fmt.Errorf("%d failures (warnings above), %d jumps and %d chains deleted", res.Failures, res.Rules, res.Chains)
		}
		log.Info("synced, then removed kube-proxy's iptables rules and chains (--cleanup-kube-proxy-iptables)",
			"jumps", res.Rules, "chains", res.Chains)
		return nil
	}}
}

// afterFirstSync returns syncFn, which also runs steps after its successes (every
// family synced) until each is done: the node keeps the other proxy's rules until it
// has nftproxy's. A failed step is logged and retried after the next successful sync.
func afterFirstSync(syncFn runner.Func, steps []*afterSyncStep, log *slog.Logger) runner.Func {
	if len(steps) == 0 {
		return syncFn
	}
	return func(ctx context.Context, full bool) error {
		if err := syncFn(ctx, full); err != nil {
			return err
		}
		for _, s := range steps { // the runner calls one sync at a time
			if s.done {
				continue
			}
			s.tries++
			err := s.run(ctx)
			switch {
			case err == nil:
				s.done = true
			case s.attempts > 0 && s.tries >= s.attempts:
				s.done = true
				log.Error(s.name+": giving up; what is left stays (kube-proxy --cleanup removes it)", "attempts", s.tries, "err", err)
			default:
				log.Error(s.name+": retried after the next sync", "err", err)
			}
		}
		return nil
	}
}
