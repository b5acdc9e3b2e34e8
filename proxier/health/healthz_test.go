package health

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/metrics"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// get asks h for path and returns the code and the decoded body.
func get(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q, want application/json", path, ct)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s: body %q: %v", path, rec.Body.String(), err)
	}
	return rec.Code, body
}

var (
	v4   = knftables.IPv4Family
	v6   = knftables.IPv6Family
	both = []knftables.Family{v4, v6}
)

func TestHealthzWaitsForTheFirstSyncOfEveryFamily(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	m := metrics.New()
	hs := NewHealthzServer(time.Minute, clk, m)
	h := hs.Handler()
	if code, _ := get(t, h, "/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("no family named yet: /healthz %d, want 503", code)
	}
	hs.SetFamilies(both...)
	hs.SetNodeEligible(true)
	code, body := get(t, h, "/healthz")
	if code != http.StatusServiceUnavailable || body["healthy"] != false {
		t.Errorf("before any sync: /healthz %d %v, want 503", code, body)
	}
	if body["lastUpdated"] != (time.Time{}).Format(time.RFC3339Nano) || body["currentTime"] != t0.Format(time.RFC3339Nano) {
		t.Errorf("before any sync: body %v, want a zero lastUpdated and the current time", body)
	}
	// Liveness does not wait for the API server.
	if code, _ := get(t, h, "/livez"); code != http.StatusOK {
		t.Errorf("before any sync, nothing queued: /livez %d, want 200", code)
	}
	clk.Step(time.Second)
	hs.Updated(v4)
	code, body = get(t, h, "/healthz")
	if code != http.StatusServiceUnavailable {
		t.Errorf("IPv4 synced, IPv6 not: /healthz %d, want 503", code)
	}
	status := body["status"].(map[string]any)
	if v4s := status["IPv4"].(map[string]any); v4s["healthy"] != true || v4s["lastUpdated"] != t0.Add(time.Second).Format(time.RFC3339Nano) {
		t.Errorf("IPv4 status %v", v4s)
	}
	if v6s := status["IPv6"].(map[string]any); v6s["healthy"] != false {
		t.Errorf("IPv6 status %v, want unhealthy", v6s)
	}
	clk.Step(time.Second)
	hs.Updated(v6)
	code, body = get(t, h, "/healthz")
	if code != http.StatusOK || body["healthy"] != true || body["nodeEligible"] != true {
		t.Errorf("both synced: /healthz %d %v, want 200", code, body)
	}
	// Healthy answers carry the current time as lastUpdated, as kube-proxy's.
	if body["lastUpdated"] != clk.Now().Format(time.RFC3339Nano) {
		t.Errorf("lastUpdated = %v, want the current time", body["lastUpdated"])
	}
	if got := testutil.ToFloat64(m.HealthzRequests.WithLabelValues("503")); got != 3 {
		t.Errorf("healthz 503 count = %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.HealthzRequests.WithLabelValues("200")); got != 1 {
		t.Errorf("healthz 200 count = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.LivezRequests.WithLabelValues("200")); got != 1 {
		t.Errorf("livez 200 count = %v, want 1", got)
	}
}

// ready returns a server with both families synced at t0 on an eligible node.
func ready(clk *clocktesting.FakeClock, m *metrics.Metrics) *HealthzServer {
	hs := NewHealthzServer(60*time.Second, clk, m)
	hs.SetFamilies(both...)
	hs.SetNodeEligible(true)
	hs.Updated(v4)
	hs.Updated(v6)
	return hs
}

func TestHealthzTurnsStaleWhenAChangeWaitsTooLong(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	m := metrics.New()
	hs := ready(clk, m)
	h := hs.Handler()

	hs.QueuedUpdate()
	clk.Step(59 * time.Second)
	if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("change pending less than the timeout: %d, want 200", code)
	}
	clk.Step(time.Second) // stale at the timeout, as kube-proxy's
	hs.Updated(v4)        // IPv6 still waits
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := get(t, h, path)
		if code != http.StatusServiceUnavailable {
			t.Errorf("IPv6 change pending past the timeout: %s %d, want 503", path, code)
		}
		if want := t0.Add(60 * time.Second).Format(time.RFC3339Nano); body["lastUpdated"] != want {
			t.Errorf("%s lastUpdated = %v, want the latest sync %v", path, body["lastUpdated"], want)
		}
		if st := body["status"].(map[string]any); st["IPv4"].(map[string]any)["healthy"] != true || st["IPv6"].(map[string]any)["healthy"] != false {
			t.Errorf("%s status = %v, want IPv4 healthy and IPv6 not", path, st)
		}
	}

	hs.Updated(v6)
	if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
		t.Fatalf("after a sync: %d, want 200", code)
	}
	// No pending change: healthy however long ago the last sync was.
	clk.Step(time.Hour)
	if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("idle for an hour: %d, want 200", code)
	}
	if got := testutil.ToFloat64(m.HealthzRequests.WithLabelValues("503")); got != 1 {
		t.Errorf("healthz 503 count = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.LivezRequests.WithLabelValues("503")); got != 1 {
		t.Errorf("livez 503 count = %v, want 1", got)
	}
}

func TestHealthzNodeEligibility(t *testing.T) {
	hs := ready(clocktesting.NewFakeClock(t0), nil)
	hs.SetNodeEligible(false)
	code, body := get(t, hs.Handler(), "/healthz")
	if code != http.StatusServiceUnavailable || body["nodeEligible"] != false || body["healthy"] != true {
		t.Errorf("ineligible node: /healthz %d %v, want 503, healthy and nodeEligible false", code, body)
	}
	code, body = get(t, hs.Handler(), "/livez")
	if code != http.StatusOK {
		t.Errorf("ineligible node: /livez %d, want 200", code)
	}
	if _, ok := body["nodeEligible"]; ok {
		t.Errorf("/livez body has nodeEligible: %v", body)
	}
	// An unknown node is not eligible either, as in kube-proxy.
	hs = NewHealthzServer(time.Minute, clocktesting.NewFakeClock(t0), nil)
	hs.SetFamilies(v4)
	hs.Updated(v4)
	if code, body := get(t, hs.Handler(), "/healthz"); code != http.StatusServiceUnavailable || body["nodeEligible"] != false {
		t.Errorf("unknown node: /healthz %d %v, want 503 and nodeEligible false", code, body)
	}
	if !hs.Healthy() || hs.Ready() {
		t.Errorf("unknown node: Healthy %v Ready %v, want true false", hs.Healthy(), hs.Ready())
	}
}

func TestHealthzLivezTurnsStaleBeforeTheFirstSync(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	hs := NewHealthzServer(time.Minute, clk, nil)
	hs.SetFamilies(v4)
	hs.QueuedUpdate()
	clk.Step(61 * time.Second)
	if code, _ := get(t, hs.Handler(), "/livez"); code != http.StatusServiceUnavailable {
		t.Errorf("a change waited past the timeout for the first sync: /livez %d, want 503", code)
	}
}

func TestHealthzChangesQueuedDuringASyncStayPending(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	hs := ready(clk, nil)
	hs.QueuedUpdate()
	start := clk.Now()
	clk.Step(time.Second)
	hs.QueuedUpdate() // arrives while the sync runs
	clk.Step(time.Second)
	hs.UpdatedAsOf(v4, start)
	hs.UpdatedAsOf(v6, start)
	clk.Step(time.Minute)
	if hs.Healthy() {
		t.Fatalf("a change queued during the sync and never applied is not reported stale")
	}
	hs.UpdatedAsOf(v4, clk.Now())
	hs.UpdatedAsOf(v6, clk.Now())
	if !hs.Healthy() {
		t.Fatalf("healthy = false after a sync that applied everything")
	}
}

func TestHealthzServesOverHTTP(t *testing.T) {
	hs := ready(clocktesting.NewFakeClock(t0), nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ctx, l) }()
	resp, err := http.Get("http://" + l.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"nodeEligible":true`) {
		t.Errorf("GET /healthz = %d %q", resp.StatusCode, raw)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve returned %v after shutdown", err)
	}
}
