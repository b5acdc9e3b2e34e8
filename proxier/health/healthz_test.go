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

func TestHealthzTurnsStaleWhenAChangeWaitsTooLong(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	m := metrics.New()
	hs := NewHealthzServer(60*time.Second, clk, m)
	h := hs.Handler()

	code, body := get(t, h, "/healthz")
	if code != http.StatusOK {
		t.Fatalf("fresh server: /healthz %d, want 200", code)
	}
	if body["currentTime"] != t0.Format(time.RFC3339Nano) || body["nodeEligible"] != true {
		t.Errorf("fresh server body = %v", body)
	}
	if _, ok := body["lastUpdated"]; !ok {
		t.Errorf("body has no lastUpdated: %v", body)
	}

	hs.QueuedUpdate()
	clk.Step(60 * time.Second)
	if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("change pending exactly the timeout: %d, want 200", code)
	}
	clk.Step(time.Second)
	for _, path := range []string{"/healthz", "/livez"} {
		if code, _ := get(t, h, path); code != http.StatusServiceUnavailable {
			t.Errorf("change pending past the timeout: %s %d, want 503", path, code)
		}
	}

	hs.Updated()
	code, body = get(t, h, "/healthz")
	if code != http.StatusOK {
		t.Fatalf("after a sync: %d, want 200", code)
	}
	if want := t0.Add(61 * time.Second).Format(time.RFC3339Nano); body["lastUpdated"] != want {
		t.Errorf("lastUpdated = %v, want %v", body["lastUpdated"], want)
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
	hs := NewHealthzServer(time.Minute, clocktesting.NewFakeClock(t0), nil)
	hs.SetNodeEligible(false)
	code, body := get(t, hs.Handler(), "/healthz")
	if code != http.StatusServiceUnavailable || body["nodeEligible"] != false {
		t.Errorf("ineligible node: /healthz %d %v, want 503 and nodeEligible false", code, body)
	}
	code, body = get(t, hs.Handler(), "/livez")
	if code != http.StatusOK {
		t.Errorf("ineligible node: /livez %d, want 200", code)
	}
	if _, ok := body["nodeEligible"]; ok {
		t.Errorf("/livez body has nodeEligible: %v", body)
	}
}

func TestHealthzChangesQueuedDuringASyncStayPending(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	hs := NewHealthzServer(time.Minute, clk, nil)
	hs.QueuedUpdate()
	start := clk.Now()
	clk.Step(time.Second)
	hs.QueuedUpdate() // arrives while the sync runs
	clk.Step(time.Second)
	hs.UpdatedAsOf(start)
	clk.Step(time.Minute)
	if hs.Healthy() {
		t.Fatalf("a change queued during the sync and never applied is not reported stale")
	}
	hs.UpdatedAsOf(clk.Now())
	if !hs.Healthy() {
		t.Fatalf("healthy = false after a sync that applied everything")
	}
}

func TestHealthzServesOverHTTP(t *testing.T) {
	hs := NewHealthzServer(time.Minute, nil, nil)
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
