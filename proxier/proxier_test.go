package proxier

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/conntrack"
	"github.com/nftproxy/nftproxy/proxier/health"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

func TestSyncProgramsServiceIPs(t *testing.T) {
	p, fs := newTestProxier(t, nil)
	p.OnNodeUpdate(node("192.168.0.10"))
	p.OnServiceUpdate(webService())
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a"), ep("10.2.0.6", "node-b")))
	mustSync(t, p)

	if got := dispatch(t, fs[knftables.IPv4Family], "service-ips", keyOf("172.30.0.10", "tcp", 80)...); got != "goto dnat-2" {
		t.Errorf("service-ips verdict for 172.30.0.10 . tcp . 80 = %q, want goto dnat-2:\n%s", got, fs[knftables.IPv4Family].Dump())
	}
	if fs[knftables.IPv6Family].Table == nil {
		t.Errorf("the ip6 table was not created")
	}
	if n := histogramCount(t, p, "kubeproxy_sync_full_proxy_rules_duration_seconds", `ip_family="IPv4"`); n != 1 {
		t.Errorf("full sync count = %d, want 1", n)
	}
	if got := testutil.ToFloat64(p.metrics.Services.WithLabelValues("IPv4")); got != 1 {
		t.Errorf("services{ip} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(p.metrics.Endpoints.WithLabelValues("IPv4")); got != 2 {
		t.Errorf("endpoints{ip} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(p.metrics.TableObjects.WithLabelValues("IPv4")); got == 0 {
		t.Errorf("table_objects{ip} = 0")
	}
}

func TestChangeIsAnIncrementalTransaction(t *testing.T) {
	p, fs := newTestProxier(t, nil)
	p.OnServiceUpdate(webService())
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a")))
	mustSync(t, p)
	v4 := fs[knftables.IPv4Family]

	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a"), ep("10.2.0.6", "node-b")))
	mustSync(t, p)
	tx := lastTransaction(v4)
	for _, unwanted := range []string{"add table", "flush map", "flush set", "delete set"} {
		if strings.Contains(tx, unwanted) {
			t.Errorf("incremental transaction contains %q:\n%s", unwanted, tx)
		}
	}
	for _, want := range []string{
		"add element ip " + testTable + " backends-1 { 172.30.0.10 . tcp . 80 : 10.2.0.6 . 8080 }",
		"add element ip " + testTable + " service-ips-to-dnat-2 { 172.30.0.10 . tcp . 80",
		// The class set dnat-1 is emptied and kept for the next Service that needs it.
		"delete element ip " + testTable + " service-ips-to-dnat-1 { 172.30.0.10 . tcp . 80 }",
	} {
		if !strings.Contains(tx, want) {
			t.Errorf("incremental transaction lacks %q:\n%s", want, tx)
		}
	}
	if got := dispatch(t, v4, "service-ips", keyOf("172.30.0.10", "tcp", 80)...); got != "goto dnat-2" {
		t.Errorf("service-ips verdict after the change = %q, want goto dnat-2", got)
	}
	if n := histogramCount(t, p, "kubeproxy_sync_partial_proxy_rules_duration_seconds", `ip_family="IPv4"`); n != 1 {
		t.Errorf("partial sync count = %d, want 1", n)
	}

	// Nothing changed: no transaction at all.
	before := v4.LastTransaction
	runs := v4.runs
	mustSync(t, p)
	if v4.LastTransaction != before || v4.runs != runs {
		t.Errorf("a sync without changes ran a transaction:\n%s", lastTransaction(v4))
	}
}

func TestInvalidObjectIsReportedAndTheRestServed(t *testing.T) {
	p, fs := newTestProxier(t, nil)
	bad := service("default", "broken", "172.30.0.20", port{"x", "TCPX", 81, 0})
	p.OnServiceUpdate(bad)
	p.OnServiceUpdate(webService())
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a")))
	mustSync(t, p)

	if dispatch(t, fs[knftables.IPv4Family], "service-ips", keyOf("172.30.0.10", "tcp", 80)...) == "" {
		t.Errorf("the valid Service is not served next to an invalid one")
	}
	errs := p.Tracker().Errors()
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "service default/broken: spec.ports[0].protocol") {
		t.Errorf("tracker errors = %v, want one naming service default/broken and its field", errs)
	}
	if got := testutil.ToFloat64(p.metrics.InvalidObjects.WithLabelValues(state.KindService)); got != 1 {
		t.Errorf("invalid_objects{kind=Service} = %v, want 1", got)
	}
	// Fixing the object clears the metric.
	p.OnServiceUpdate(service("default", "broken", "172.30.0.20", port{"x", v1.ProtocolTCP, 81, 0}))
	mustSync(t, p)
	if got := testutil.ToFloat64(p.metrics.InvalidObjects.WithLabelValues(state.KindService)); got != 0 {
		t.Errorf("invalid_objects{kind=Service} after the fix = %v, want 0", got)
	}
}

func TestFailedSyncIsRetriedInFull(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	hz := health.NewHealthzServer(time.Minute, clk, nil)
	p, fs := newTestProxier(t, func(c *Config) { c.Clock, c.Healthz = clk, hz })
	p.OnServiceUpdate(webService())
	mustSync(t, p)
	v4 := fs[knftables.IPv4Family]

	v4.setFailing(true)
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a")))
	err := p.Sync(context.Background())
	if err == nil || !strings.Contains(err.Error(), "table ip "+testTable) {
		t.Fatalf("sync over a failing nft: err = %v, want one naming the table", err)
	}
	if got := testutil.ToFloat64(p.metrics.SyncFailures.WithLabelValues("IPv4")); got != 1 {
		t.Errorf("sync_failures_total{family=ip} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(p.metrics.SyncFailures.WithLabelValues("IPv6")); got != 0 {
		t.Errorf("sync_failures_total{family=ip6} = %v, want 0", got)
	}
	clk.Step(2 * time.Minute)
	if hz.Healthy() {
		t.Errorf("healthz is healthy while a change waits behind a failing sync")
	}

	v4.setFailing(false)
	mustSync(t, p)
	if tx := lastTransaction(v4); !strings.Contains(tx, "add table") {
		t.Errorf("the retry after a failure was not a full sync:\n%s", tx)
	}
	if dispatch(t, v4, "service-ips", keyOf("172.30.0.10", "tcp", 80)...) == "" {
		t.Errorf("the retried sync did not apply the change")
	}
	if !hz.Healthy() {
		t.Errorf("healthz still unhealthy after a successful sync")
	}
}

func TestFullSyncRepairsDrift(t *testing.T) {
	p, fs := newTestProxier(t, nil)
	p.OnServiceUpdate(webService())
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a")))
	mustSync(t, p)
	v4 := fs[knftables.IPv4Family]

	// Someone flushes our set behind our back.
	tx := v4.NewTransaction()
	tx.Flush(&knftables.Set{Name: "service-ips-to-dnat-1"})
	if err := v4.Fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	mustSync(t, p) // nothing changed as far as the proxier knows
	if dispatch(t, v4, "service-ips", keyOf("172.30.0.10", "tcp", 80)...) != "" {
		t.Fatalf("test is broken: a partial sync without changes repaired drift")
	}
	if err := p.SyncMode(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if dispatch(t, v4, "service-ips", keyOf("172.30.0.10", "tcp", 80)...) == "" {
		t.Errorf("the full sync did not restore the flushed element")
	}
}

// TestNetworkProgrammingLatency checks kube-proxy's meaning: from an
// EndpointSlice's last-change-trigger-time to the sync that applied it, by the
// slice's family; neither slices changed before the Proxier started (the
// informers' first list) nor Service events add a sample.
func TestNetworkProgrammingLatency(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	p, _ := newTestProxier(t, func(c *Config) { c.Clock = clk })
	annotate := func(sl *discoveryv1.EndpointSlice, at time.Time) *discoveryv1.EndpointSlice {
		sl.Annotations = map[string]string{LastChangeTriggerTimeAnnotation: at.Format(time.RFC3339Nano)}
		return sl
	}

	p.OnEndpointSliceUpdate(annotate(webSlice(ep("10.1.0.5", "node-a")), t0.Add(-5*time.Second)))
	p.OnServiceUpdate(webService())
	mustSync(t, p)
	if count, _ := histogram(t, p, "kubeproxy_network_programming_duration_seconds", ""); count != 0 {
		t.Errorf("a change from before the start was recorded: %d samples", count)
	}

	clk.Step(10 * time.Second)
	p.OnEndpointSliceUpdate(annotate(webSlice(ep("10.1.0.6", "node-a")), t0.Add(8*time.Second)))
	v6 := slice("default", "web", "web-v6", []port{target(httpPort, 8080)}, ep("fd00::6", "node-a"))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	p.OnEndpointSliceUpdate(annotate(v6, t0.Add(9*time.Second)))
	p.OnServiceUpdate(webService()) // no sample
	clk.Step(2 * time.Second)
	mustSync(t, p)

	if count, sum := histogram(t, p, "kubeproxy_network_programming_duration_seconds", `ip_family="IPv4"`); count != 1 || sum != 4 {
		t.Errorf("IPv4 network programming: %d samples summing %vs, want 1 of 4s", count, sum)
	}
	if count, sum := histogram(t, p, "kubeproxy_network_programming_duration_seconds", `ip_family="IPv6"`); count != 1 || sum != 3 {
		t.Errorf("IPv6 network programming: %d samples summing %vs, want 1 of 3s", count, sum)
	}
	// A no-op update (same object again) records nothing.
	p.OnEndpointSliceUpdate(annotate(webSlice(ep("10.1.0.6", "node-a")), t0.Add(8*time.Second)))
	mustSync(t, p)
	if count, _ := histogram(t, p, "kubeproxy_network_programming_duration_seconds", `ip_family="IPv4"`); count != 1 {
		t.Errorf("a no-op update was recorded: %d samples", count)
	}
}

// recordingCleaner records the conntrack filters it is asked to clear.
type recordingCleaner struct{ filters [][]conntrack.Filter }

func (r *recordingCleaner) Clear(fs []conntrack.Filter) (uint, error) {
	r.filters = append(r.filters, fs)
	return uint(len(fs)), nil
}

func TestConntrackCleanupFollowsUDPEndpointChanges(t *testing.T) {
	cl := &recordingCleaner{}
	p, _ := newTestProxier(t, func(c *Config) { c.Conntrack = cl })
	p.OnServiceUpdate(service("kube-system", "dns", "172.30.0.53", dnsPort))
	mustSync(t, p)
	if len(cl.filters) != 0 {
		t.Errorf("a UDP Service without endpoints cleared %v", cl.filters)
	}
	dnsSlice := func(eps ...endpoint) {
		p.OnEndpointSliceUpdate(slice("kube-system", "dns", "dns-1", []port{target(dnsPort, 5353)}, eps...))
		mustSync(t, p)
	}
	dnsSlice(ep("10.1.0.9", "node-b"), ep("10.1.0.10", "node-b"))
	dnsSlice(ep("10.1.0.10", "node-b"))
	want := [][]conntrack.Filter{
		{{OrigDst: ap("172.30.0.53:53"), NotNATed: true}},
		{{OrigDst: ap("172.30.0.53:53"), ReplySrc: ap("10.1.0.9:5353")}},
	}
	if len(cl.filters) != len(want) {
		t.Fatalf("cleared %v, want %v", cl.filters, want)
	}
	for i := range want {
		if len(cl.filters[i]) != 1 || cl.filters[i][0] != want[i][0] {
			t.Errorf("clear %d = %v, want %v", i, cl.filters[i], want[i])
		}
	}
	if got := testutil.ToFloat64(p.metrics.ConntrackDeleted.WithLabelValues("IPv4")); got != 2 {
		t.Errorf("conntrack entries deleted = %v, want 2", got)
	}
}

func TestNodeEligibility(t *testing.T) {
	hz := health.NewHealthzServer(time.Minute, nil, nil)
	p, _ := newTestProxier(t, func(c *Config) { c.Healthz = hz })
	n := node("192.168.0.10")
	n.Spec.Taints = []v1.Taint{{Key: TaintToBeDeleted, Effect: v1.TaintEffectNoSchedule}}
	p.OnNodeUpdate(n)
	if _, body := getJSON(t, hz, "/healthz"); body["nodeEligible"] != false {
		t.Errorf("node tainted for deletion: nodeEligible = %v", body["nodeEligible"])
	}
	n.Spec.Taints = nil
	p.OnNodeUpdate(n)
	if _, body := getJSON(t, hz, "/healthz"); body["nodeEligible"] != true {
		t.Errorf("untainted node: nodeEligible = %v", body["nodeEligible"])
	}
	n.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	p.OnNodeUpdate(n)
	if _, body := getJSON(t, hz, "/healthz"); body["nodeEligible"] != false {
		t.Errorf("node being deleted: nodeEligible = %v", body["nodeEligible"])
	}
}

func TestUnavailableFamilyIsDropped(t *testing.T) {
	fs := fakes{}
	newNFT := func(fam knftables.Family, table string) (knftables.Interface, error) {
		if fam == knftables.IPv6Family {
			return nil, errors.New("no IPv6 in this kernel")
		}
		return fs.newNFT(fam, table)
	}
	p, err := New(Config{NodeName: "node-a", NewNFT: newNFT})
	if err != nil {
		t.Fatalf("New with IPv6 unavailable: %v", err)
	}
	if got := p.Families(); len(got) != 1 || got[0] != knftables.IPv4Family {
		t.Errorf("families = %v, want [ip]", got)
	}
	_, err = New(Config{NodeName: "node-a", NewNFT: func(knftables.Family, string) (knftables.Interface, error) {
		return nil, errors.New("nft not found")
	}})
	if err == nil || !strings.Contains(err.Error(), "nft not found") {
		t.Errorf("New with no family usable: err = %v", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "nodeName") {
		t.Errorf("no node name: err = %v", err)
	}
	_, err := New(Config{NodeName: "n", NewNFT: fakes{}.newNFT})
	if err != nil {
		t.Errorf("minimal config: %v", err)
	}
	_, err = New(Config{NodeName: "n", NewNFT: fakes{}.newNFT, Ruleset: rulesetConfig("Bogus")})
	if err == nil || !strings.Contains(err.Error(), "detectLocalMode") {
		t.Errorf("bad local mode: err = %v, want one naming detectLocalMode", err)
	}
}

func TestCleanupRemovesBothTables(t *testing.T) {
	fs := fakes{}
	p, err := New(Config{NodeName: "node-a", NewNFT: fs.newNFT, Ruleset: rulesetConfig("")})
	if err != nil {
		t.Fatal(err)
	}
	p.OnServiceUpdate(webService())
	mustSync(t, p)
	for fam, f := range fs {
		if f.Table == nil {
			t.Fatalf("table %s not created", fam)
		}
	}
	// Cleanup opens the tables anew, as `nftproxy --cleanup` does in a new process:
	// hand it the same Fakes.
	reopen := func(fam knftables.Family, _ string) (knftables.Interface, error) { return fs[fam], nil }
	if err := Cleanup(context.Background(), reopen, testTable); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	for fam, f := range fs {
		if f.Table != nil || len(f.Tables[fam]) != 0 {
			t.Errorf("table %s still exists after cleanup:\n%s", fam, f.Dump())
		}
	}
	// Cleaning up again (nothing there) succeeds.
	if err := Cleanup(context.Background(), reopen, testTable); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestNoOpEventKeepsHealthzHealthy(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	hz := health.NewHealthzServer(time.Minute, clk, nil)
	p, _ := newTestProxier(t, func(c *Config) { c.Clock, c.Healthz = clk, hz })
	p.OnServiceUpdate(webService())
	mustSync(t, p)
	p.OnServiceUpdate(webService()) // the same object again: nothing to apply
	mustSync(t, p)
	clk.Step(2 * time.Minute)
	if !hz.Healthy() {
		t.Errorf("a no-op event left healthz waiting for a sync")
	}
}

// TestFirstSyncWritesTheBuildThenAdoptsTheBuilder checks the first sync of a
// family: one full transaction, written from ruleset.Build, then the Builder's
// ruleset taken over without another transaction (it equals the table), so that
// the next change is an incremental transaction. A first sync that fails leaves
// the Builder unused, and the retry starts over.
func TestFirstSyncWritesTheBuildThenAdoptsTheBuilder(t *testing.T) {
	p, fs := newTestProxier(t, nil)
	p.OnServiceUpdate(webService())
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a")))
	v4 := fs[knftables.IPv4Family]
	if p.syncers[knftables.IPv4Family].Netlink() {
		t.Error("a Syncer of a Proxier without Config.Netlink writes elements over netlink")
	}
	v4.setFailing(true)
	if err := p.Sync(context.Background()); err == nil {
		t.Fatal("first sync over a failing nft succeeded")
	}
	if p.built[knftables.IPv4Family] {
		t.Error("the failed first sync marked the ip Builder built")
	}
	v4.setFailing(false)
	runs := v4.runs
	mustSync(t, p)
	if v4.runs != runs+1 {
		t.Errorf("first sync ran %d transactions; want 1 (the Builder's ruleset equals the table)", v4.runs-runs)
	}
	want := ruleset.Build(p.tracker.State(), p.cfg.Ruleset, knftables.IPv4Family)
	if d := changeset.Diff(want, p.syncers[knftables.IPv4Family].Applied()); d.Len() != 0 {
		t.Errorf("the applied ruleset differs from a fresh Build in %d objects", d.Len())
	}
	rs, _ := p.builders[knftables.IPv4Family].Update(p.tracker.State(), map[state.ServiceName]bool{})
	if p.syncers[knftables.IPv4Family].Applied() != rs {
		t.Error("the Syncer did not take over the Builder's ruleset")
	}
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a"), ep("10.2.0.6", "node-b")))
	mustSync(t, p)
	if tx := lastTransaction(v4); strings.Contains(tx, "add table") || !strings.Contains(tx, "10.2.0.6") {
		t.Errorf("the change after the first sync is not an incremental transaction:\n%s", tx)
	}
}
