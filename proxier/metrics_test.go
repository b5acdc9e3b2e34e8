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
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"

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
	p.OnNodeUpdate(node("192.168.0.10"))
	p.OnServiceUpdate(webService())
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a"), ep("10.2.0.6", "node-b")))
	p.OnServiceUpdate(service("default", "broken", "172.30.0.20", port{"x", "TCPX", 81, 0}))
	local := service("default", "local", "172.30.0.30", httpPort)
	local.Spec.InternalTrafficPolicy = ptrTo(v1.ServiceInternalTrafficPolicyLocal)
	p.OnServiceUpdate(local)
	p.OnEndpointSliceUpdate(slice("default", "local", "local-1", []port{target(httpPort, 8080)}, ep("10.2.0.7", "node-b")))
	mustSync(t, p)
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.5", "node-a")))
	mustSync(t, p)
	fs[knftables.IPv4Family].setFailing(true)
	p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.6", "node-a")))
	if err := p.Sync(context.Background()); err == nil {
		t.Fatal("sync over a failing nft succeeded")
	}

	text := scrape(t, p)
	// Five changes reached the tables (web and local: Service and slice each, then
	// web's slice again); the invalid Service changed nothing and the last change
	// is still pending. Both partial transactions count, the failed one too.
	for _, want := range []string{
		`nftproxy_sync_proxy_rules_duration_seconds_count{type="full"} 1`,
		`nftproxy_sync_proxy_rules_duration_seconds_count{type="partial"} 2`,
		`nftproxy_network_programming_duration_seconds_count 5`,
		`nftproxy_sync_failures_total{family="ip"} 1`,
		`nftproxy_sync_operations_count{family="ip",type="partial"} 2`,
		`nftproxy_services{family="ip"} 2`,
		`nftproxy_services{family="ip6"} 0`,
		`nftproxy_endpoints{family="ip"} 2`,
		`nftproxy_services_without_local_endpoints{traffic_policy="internal"} 1`,
		`nftproxy_services_without_local_endpoints{traffic_policy="external"} 0`,
		`nftproxy_invalid_objects{kind="Service"} 1`,
		`nftproxy_invalid_objects{kind="EndpointSlice"} 0`,
		`nftproxy_sync_proxy_rules_service_changes_total 3`,
		`nftproxy_sync_proxy_rules_endpoint_changes_total 4`,
		`# TYPE nftproxy_sync_proxy_rules_last_timestamp_seconds gauge`,
		`# TYPE nftproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge`,
		`# TYPE nftproxy_table_objects gauge`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", grepPrefix(text, "nftproxy_"))
	}
	if strings.Contains(text, `nftproxy_sync_proxy_rules_last_timestamp_seconds 0`) {
		t.Errorf("last sync timestamp is 0 after successful syncs")
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
