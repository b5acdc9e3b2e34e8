package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/metrics"
	"github.com/nftproxy/nftproxy/proxier/takeover"
)

// TestCleanupTableAfterSync runs the daemon with --cleanup-table-after-sync=kube-proxy on
// a node holding kube-proxy's tables: they are deleted, in both families, and only once
// nftproxy's own table serves the Services.
func TestCleanupTableAfterSync(t *testing.T) {
	ours, theirs := &fakeTables{}, &fakeTables{}
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, _ := theirs.newNFT(fam, "kube-proxy")
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: "services"})
		if err := nft.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
	}
	var early atomic.Bool // kube-proxy's table opened before ours served the Service
	newNFT := func(fam knftables.Family, table string) (knftables.Interface, error) {
		if table == "kube-proxy" {
			if !ours.hasServiceIP(knftables.IPv4Family, "172.30.0.10", "tcp", "80") {
				early.Store(true)
			}
			return theirs.newNFT(fam, table)
		}
		return ours.newNFT(fam, table)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "1"}}
	cs := fake.NewClientset(node, testService("web", "172.30.0.10"), testSlice("web", "10.1.0.5"))
	d := deps{newNFT: newNFT, newClient: func(*Options) (kubernetes.Interface, error) { return cs, nil }}
	args := []string{"--hostname-override=node-a", "--cluster-cidr=10.0.0.0/8", "--healthz-bind-address=",
		"--metrics-bind-address=", "--cleanup-table-after-sync=kube-proxy"}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &stderr, d) }()
	eventually(t, "kube-proxy's tables deleted", func() bool {
		return theirs.get(knftables.IPv4Family).Dump() == "" && theirs.get(knftables.IPv6Family).Dump() == ""
	})
	if early.Load() {
		t.Error("kube-proxy's tables were touched before nftproxy's served the Service")
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("daemon exited %d: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not stop after its context was cancelled")
	}
	if !strings.Contains(stderr.String(), "deleted the tables of --cleanup-table-after-sync") {
		t.Errorf("the log does not say the tables were deleted:\n%s", stderr.String())
	}
}

// TestCleanupTableAfterSyncNotOwnTable: the flag refuses nftproxy's own table.
func TestCleanupTableAfterSyncNotOwnTable(t *testing.T) {
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"--hostname-override=n", "--cleanup-table-after-sync=nftproxy"}, &stderr, deps{})
	if code != 1 || !strings.Contains(stderr.String(), "--cleanup-table-after-sync") {
		t.Errorf("exit %d, stderr %q; want 1 and a message naming --cleanup-table-after-sync", code, stderr.String())
	}
}

// TestCleanupKubeProxyIptables runs the daemon with --cleanup-kube-proxy-iptables: the
// cleanup runs only once nftproxy's table serves the Services, a failed run is retried
// after a later sync, and a successful one is not repeated.
func TestCleanupKubeProxyIptables(t *testing.T) {
	ours := &fakeTables{}
	var calls, early atomic.Int32
	clean := func(_ context.Context, cfg takeover.Config) takeover.Result {
		if !ours.hasServiceIP(knftables.IPv4Family, "172.30.0.10", "tcp", "80") {
			early.Add(1)
		}
		if calls.Add(1) == 1 {
			cfg.Failed(takeover.BackendNft, "IPv4")
			return takeover.Result{Rules: 2, Failures: 1}
		}
		return takeover.Result{Rules: 1, Chains: 4}
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "1"}}
	cs := fake.NewClientset(node, testService("web", "172.30.0.10"), testSlice("web", "10.1.0.5"))
	d := deps{newNFT: ours.newNFT, newClient: func(*Options) (kubernetes.Interface, error) { return cs, nil }, iptablesCleanup: clean}
	args := []string{"--hostname-override=node-a", "--cluster-cidr=10.0.0.0/8", "--healthz-bind-address=",
		"--metrics-bind-address=", "--cleanup-kube-proxy-iptables", "--sync-period=50ms", "--min-sync-period=0s"}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &stderr, d) }()
	eventually(t, "the cleanup retried and done", func() bool {
		return strings.Contains(stderr.String(), "removed kube-proxy's iptables rules and chains")
	})
	time.Sleep(300 * time.Millisecond) // several periodic syncs, which must not run it again
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("daemon exited %d: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not stop after its context was cancelled")
	}
	if early.Load() > 0 || calls.Load() != 2 {
		t.Errorf("cleanup ran %d times, %d before nftproxy's table served the Service; want twice, after", calls.Load(), early.Load())
	}
	for _, want := range []string{"--cleanup-kube-proxy-iptables: retried after the next sync", "jumps=1 chains=4"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, stderr.String())
		}
	}
}

// TestIptablesStepGivesUp: a cleanup that keeps failing is counted in the failure metric
// and given up after iptablesCleanupAttempts syncs.
func TestIptablesStepGivesUp(t *testing.T) {
	m := metrics.New()
	var stderr bytes.Buffer
	log := slog.New(slog.NewTextHandler(&stderr, nil))
	calls := 0
	step := iptablesStep(deps{iptablesCleanup: func(_ context.Context, cfg takeover.Config) takeover.Result {
		calls++
		cfg.Failed(takeover.BackendLegacy, "IPv6")
		return takeover.Result{Failures: 1}
	}}, m, log)
	syncFn := afterFirstSync(func(context.Context, bool) error { return nil }, []*afterSyncStep{step}, log)
	for range iptablesCleanupAttempts + 2 {
		if err := syncFn(context.Background(), false); err != nil {
			t.Fatal(err)
		}
	}
	if calls != iptablesCleanupAttempts || !strings.Contains(stderr.String(), "giving up") {
		t.Errorf("%d runs, log:\n%s\nwant %d and a line giving up", calls, stderr.String(), iptablesCleanupAttempts)
	}
	got := counterValue(t, m, "nftproxy_kube_proxy_iptables_cleanup_failures_total", "iptables-legacy", "IPv6")
	if got != float64(iptablesCleanupAttempts) {
		t.Errorf("failures counted %v, want %d", got, iptablesCleanupAttempts)
	}
}

// counterValue returns the value of the counter name with labels backend and
// ip_family in m's registry.
func counterValue(t *testing.T, m *metrics.Metrics, name, backend, family string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["backend"] == backend && labels["ip_family"] == family {
				return mt.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{backend=%q,ip_family=%q}", name, backend, family)
	return 0
}
