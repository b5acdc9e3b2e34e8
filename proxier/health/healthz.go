// Package health serves the proxier's health: /healthz and /livez on the healthz
// address, as kube-proxy serves them, and one health-check node port per
// externalTrafficPolicy Local load balancer, reporting its local endpoint count.
package health

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/nftproxy/nftproxy/proxier/metrics"
)

// HealthzServer reports whether the proxier keeps its rules up to date. It is
// healthy while no change has waited longer than the health timeout for a
// successful sync (kube-proxy uses twice the sync period).
type HealthzServer struct {
	clock   clock.PassiveClock
	timeout time.Duration
	metrics *metrics.Metrics

	mu sync.Mutex
	// lastUpdated is when the last successful sync finished.
	lastUpdated time.Time
	// oldestPending is when the oldest change not yet applied was queued; zero
	// when every change has been applied.
	oldestPending time.Time
	// latestQueued is when the newest change was queued.
	latestQueued time.Time
	nodeEligible bool
}

// Status is the body of /healthz (and, without NodeEligible, of /livez).
type Status struct {
	// LastUpdated is when the last successful sync finished (zero before the first).
	LastUpdated time.Time `json:"lastUpdated"`
	// CurrentTime is the time of the answer.
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is false while the node is being deleted or drained by the
	// cluster autoscaler, so that load balancers stop sending traffic here.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
}

// NewHealthzServer returns a HealthzServer that turns unhealthy when a change has
// waited longer than timeout. clk defaults to the real clock; m may be nil.
func NewHealthzServer(timeout time.Duration, clk clock.PassiveClock, m *metrics.Metrics) *HealthzServer {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &HealthzServer{clock: clk, timeout: timeout, metrics: m, nodeEligible: true}
}

// QueuedUpdate records that a change is waiting for a sync.
func (h *HealthzServer) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latestQueued = h.clock.Now()
	if h.oldestPending.IsZero() {
		h.oldestPending = h.latestQueued
	}
}

// Updated records a successful sync that applied every change queued before it.
func (h *HealthzServer) Updated() {
	h.UpdatedAsOf(time.Time{})
}

// UpdatedAsOf records a successful sync that read the cluster state at start:
// changes queued after start stay pending (counted from the newest of them, as only
// the oldest and newest times are kept). A zero start means every queued change was
// applied.
func (h *HealthzServer) UpdatedAsOf(start time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.clock.Now()
	switch {
	case start.IsZero() || !h.latestQueued.After(start):
		h.oldestPending = time.Time{}
	case !h.oldestPending.After(start):
		h.oldestPending = h.latestQueued
	}
}

// SetNodeEligible records whether the node may receive load-balancer traffic.
func (h *HealthzServer) SetNodeEligible(eligible bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = eligible
}

// Healthy reports whether every pending change is younger than the timeout.
func (h *HealthzServer) Healthy() bool {
	healthy, _ := h.status()
	return healthy
}

func (h *HealthzServer) status() (bool, Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock.Now()
	eligible := h.nodeEligible
	healthy := h.oldestPending.IsZero() || now.Sub(h.oldestPending) <= h.timeout
	return healthy, Status{LastUpdated: h.lastUpdated, CurrentTime: now, NodeEligible: &eligible}
}

// Handler serves /healthz (healthy and node eligible) and /livez (healthy).
func (h *HealthzServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		healthy, st := h.status()
		h.answer(w, healthy && *st.NodeEligible, st, h.counter("healthz"))
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		healthy, st := h.status()
		st.NodeEligible = nil
		h.answer(w, healthy, st, h.counter("livez"))
	})
	return mux
}

func (h *HealthzServer) counter(path string) func(code int) {
	return func(code int) {
		if h.metrics == nil {
			return
		}
		c := h.metrics.HealthzRequests
		if path == "livez" {
			c = h.metrics.LivezRequests
		}
		c.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

func (h *HealthzServer) answer(w http.ResponseWriter, ok bool, st Status, count func(int)) {
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	count(code)
	writeJSON(w, code, st)
}

// Serve serves Handler on l until ctx is done.
func (h *HealthzServer) Serve(ctx context.Context, l net.Listener) error {
	return metrics.ServeHTTP(ctx, l, h.Handler())
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
