package proxier

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/health"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func rulesetConfig(mode ruleset.LocalMode) ruleset.Config {
	return ruleset.Config{Table: testTable, LocalMode: mode}
}

// histogram returns the sample count and sum of the histogram series of name whose
// labels, printed as name="value" pairs, contain labels.
func histogram(t *testing.T, p *Proxier, name, labels string) (uint64, float64) {
	t.Helper()
	mfs, err := p.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if strings.Contains(labelString(m), labels) {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

func histogramCount(t *testing.T, p *Proxier, name, labels string) uint64 {
	t.Helper()
	n, _ := histogram(t, p, name, labels)
	return n
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	return strings.Join(parts, ",")
}

func getJSON(t *testing.T, hz *health.HealthzServer, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	hz.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s: %q: %v", path, rec.Body.String(), err)
	}
	return rec.Code, body
}

// scrape serves the Proxier's metrics on a loopback port, as the daemon does, and
// returns one scrape's text.
func scrape(t *testing.T, p *Proxier) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.metrics.Serve(ctx, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("metrics server: %v", err)
		}
	}()
	resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	return string(body)
}

func TestMetricsScrapedOverHTTP(t *testing.T) {
	p, fs := newTestProxier(t, nil)
	text := scrape(t, p)
	// Before any event, the counters alerts compute rates of are there at zero.
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 0`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total 0`,
		`kubeproxy_sync_proxy_rules_service_changes_pending 0`,
		`kubeproxy_proxy_healthz_total{code="503"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("fresh scrape lacks %q", want)
		}
	}

	p.OnNodeUpdate(node("192.168.0.10"))
	p.OnServiceUpdate(webService())
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a"), ep("10.2.0.6", "node-b")))
	p.OnServiceUpdate(service("default", "broken", "172.30.0.20", port{"x", "TCPX", 81, 0}))
	local := service("default", "local", "172.30.0.30", httpPort)
	local.Spec.InternalTrafficPolicy = ptrTo(v1.ServiceInternalTrafficPolicyLocal)
	p.OnServiceUpdate(local)
	p.OnEndpointSliceUpdate(slice("default", "local", "local-1", []port{target(httpPort, 8080)}, ep("10.2.0.7", "node-b")))
	text = scrape(t, p)
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_service_changes_pending 3`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_pending 2`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape before the first sync lacks %q", want)
		}
	}
	if !strings.Contains(text, `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1.`) {
		t.Errorf("no last queued timestamp after changes")
	}
	mustSync(t, p)
	changed := webSlice(ep("10.1.0.5", "node-a"))
	changed.Annotations = map[string]string{LastChangeTriggerTimeAnnotation: time.Now().Format(time.RFC3339Nano)}
	p.OnEndpointSliceUpdate(changed)
	mustSync(t, p)
	fs[knftables.IPv4Family].setFailing(true)
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.6", "node-a")))
	if err := p.Sync(context.Background()); err == nil {
		t.Fatal("sync over a failing nft succeeded")
	}
	// Changes still to sync.
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.7", "node-a")))
	p.OnServiceUpdate(webService())

	text = scrape(t, p)
	// Each family synced three times: the first (full), the change and the failed
	// one (partial: for IPv4 it failed, IPv6 applied it). The annotated change
	// alone has a network programming latency. The failed sync took its change:
	// pending are the two after it.
	for _, want := range []string{
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1`,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2`,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3`,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 3`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 1`,
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 0`,
		`kubeproxy_sync_proxy_rules_service_changes_total 4`,
		`kubeproxy_sync_proxy_rules_service_changes_pending 1`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total 5`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_pending 1`,
		`# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge`,
		`nftproxy_sync_operations_count{ip_family="IPv4",type="partial"} 2`,
		`nftproxy_services{ip_family="IPv4"} 2`,
		`nftproxy_services{ip_family="IPv6"} 0`,
		`nftproxy_endpoints{ip_family="IPv4"} 2`,
		`nftproxy_invalid_objects{kind="Service"} 1`,
		`nftproxy_invalid_objects{kind="EndpointSlice"} 0`,
		`# TYPE nftproxy_table_objects gauge`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", grepPrefix(text, "kubeproxy_")+"\n"+grepPrefix(text, "nftproxy_"))
	}
	// Both families' last successful sync is recent; IPv4's is the second sync's.
	for _, fam := range []string{"IPv4", "IPv6"} {
		v := gaugeValue(t, text, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="`+fam+`"}`)
		if age := time.Since(time.Unix(0, int64(v*1e9))); age < 0 || age > time.Minute {
			t.Errorf("%s last sync timestamp %v is %v old", fam, v, age)
		}
	}
}

// gaugeValue returns the value of the scraped sample series (name and labels).
func gaugeValue(t *testing.T, text, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("scrape lacks %s", series)
	return 0
}

// TestHealthzFollowsTheProxier checks /healthz and /livez as the Proxier drives
// them: not ready before the first sync of every family, stale per family when a
// change waits behind a failing sync.
func TestHealthzFollowsTheProxier(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	hz := health.NewHealthzServer(time.Minute, clk, nil)
	p, fs := newTestProxier(t, func(c *Config) { c.Clock, c.Healthz = clk, hz })
	p.OnNodeUpdate(node("192.168.0.10"))
	p.OnServiceUpdate(webService())
	if code, body := getJSON(t, hz, "/healthz"); code != http.StatusServiceUnavailable || body["nodeEligible"] != true {
		t.Errorf("before the first sync: /healthz %d %v, want 503 on an eligible node", code, body)
	}
	if code, _ := getJSON(t, hz, "/livez"); code != http.StatusOK {
		t.Errorf("before the first sync: /livez %d, want 200", code)
	}
	mustSync(t, p)
	if code, body := getJSON(t, hz, "/healthz"); code != http.StatusOK {
		t.Errorf("after the first sync: /healthz %d %v, want 200", code, body)
	}

	fs[knftables.IPv4Family].setFailing(true)
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a")))
	if err := p.Sync(context.Background()); err == nil {
		t.Fatal("sync over a failing nft succeeded")
	}
	clk.Step(61 * time.Second)
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := getJSON(t, hz, path)
		st, _ := body["status"].(map[string]any)
		if code != http.StatusServiceUnavailable || st["IPv4"].(map[string]any)["healthy"] != false || st["IPv6"].(map[string]any)["healthy"] != true {
			t.Errorf("IPv4 failing past the timeout: %s %d %v, want 503 with IPv4 alone unhealthy", path, code, body)
		}
	}
	fs[knftables.IPv4Family].setFailing(false)
	mustSync(t, p)
	if code, body := getJSON(t, hz, "/healthz"); code != http.StatusOK {
		t.Errorf("after the retry: /healthz %d %v, want 200", code, body)
	}
}

// TestConntrackCleanupIsMeasuredByFamily checks kube-proxy's conntrack reconciler
// metrics: one cleanup per family with stale entries, its entries counted under
// the family.
func TestConntrackCleanupIsMeasuredByFamily(t *testing.T) {
	cl := &recordingCleaner{}
	p, _ := newTestProxier(t, func(c *Config) { c.Conntrack = cl })
	p.OnServiceUpdate(service("kube-system", "dns", "fd00:30::53", dnsPort))
	dnsSlice := func(eps ...endpoint) {
		sl := slice("kube-system", "dns", "dns-1", []port{target(dnsPort, 5353)}, eps...)
		sl.AddressType = discoveryv1.AddressTypeIPv6
		p.OnEndpointSliceUpdate(sl)
		mustSync(t, p)
	}
	dnsSlice(ep("fd00:1::9", "node-b"), ep("fd00:1::10", "node-b"))
	dnsSlice(ep("fd00:1::10", "node-b"))
	if len(cl.filters) != 2 {
		t.Fatalf("cleared %v, want two cleanups", cl.filters)
	}
	if got := testutil.ToFloat64(p.metrics.ConntrackDeleted.WithLabelValues("IPv6")); got != 2 {
		t.Errorf("IPv6 conntrack entries deleted = %v, want 2", got)
	}
	if got := testutil.ToFloat64(p.metrics.ConntrackDeleted.WithLabelValues("IPv4")); got != 0 {
		t.Errorf("IPv4 conntrack entries deleted = %v, want 0", got)
	}
	if n := histogramCount(t, p, "kubeproxy_conntrack_reconciler_sync_duration_seconds", `ip_family="IPv6"`); n != 2 {
		t.Errorf("IPv6 conntrack cleanups measured = %d, want 2", n)
	}
	if n := histogramCount(t, p, "kubeproxy_conntrack_reconciler_sync_duration_seconds", `ip_family="IPv4"`); n != 0 {
		t.Errorf("IPv4 conntrack cleanups measured = %d, want 0", n)
	}
}

func TestServiceHealthNodePortsFollowTheProxier(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hcPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	hz := health.NewHealthzServer(time.Minute, nil, nil)
	sh := health.NewServiceHealthServer("127.0.0.1", hz.Healthy, nil)
	defer sh.Close()
	p, _ := newTestProxier(t, func(c *Config) { c.Healthz, c.ServiceHealth = hz, sh })

	lb := service("default", "lb", "172.30.0.40", port{"http", v1.ProtocolTCP, 80, 30080})
	lb.Spec.Type = v1.ServiceTypeLoadBalancer
	lb.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	lb.Spec.HealthCheckNodePort = int32(hcPort)
	lb.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.7"}}
	p.OnServiceUpdate(lb)
	p.OnEndpointSliceUpdate(slice("default", "lb", "lb-1", []port{target(httpPort, 8080)}, ep("10.1.0.5", "node-a"), ep("10.2.0.6", "node-b")))
	mustSync(t, p)

	code, body := probeHC(t, hcPort)
	if code != http.StatusOK || body["localEndpoints"] != float64(1) {
		t.Errorf("health check node port: %d %v, want 200 with 1 local endpoint", code, body)
	}
	p.OnEndpointSliceUpdate(slice("default", "lb", "lb-1", []port{target(httpPort, 8080)}, ep("10.2.0.6", "node-b")))
	mustSync(t, p)
	if code, body := probeHC(t, hcPort); code != http.StatusServiceUnavailable || body["localEndpoints"] != float64(0) {
		t.Errorf("after the local endpoint left: %d %v, want 503 with 0", code, body)
	}
	p.OnServiceDelete(lb)
	mustSync(t, p)
	if _, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", hcPort)); err == nil {
		t.Errorf("health check node port still open after the Service was deleted")
	}
}

func probeHC(t *testing.T, port int) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

func grepPrefix(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func ptrTo[T any](v T) *T { return &v }
