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

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/metrics"
)

// HealthzServer reports whether the proxier keeps its rules up to date, per IP
// family, with kube-proxy's rules: a family is stale when a change has waited
// the health timeout or longer for a successful sync (kube-proxy uses twice the
// sync period). /livez answers 200 unless a family is stale. /healthz, which the
// readiness probe and the load balancers ask, also needs every family to have
// synced once and the node to be eligible for load-balancer traffic.
type HealthzServer struct {
	clock   clock.PassiveClock
	timeout time.Duration
	metrics *metrics.Metrics

	mu sync.Mutex
	// families are the ip_family labels of the families the proxier programs.
	families []string
	// lastUpdated is when each family's last successful sync finished.
	lastUpdated map[string]time.Time
	// oldestPending is when the oldest change a family has not yet applied was
	// queued; absent when the family applied every change.
	oldestPending map[string]time.Time
	// latestQueued is when the newest change was queued.
	latestQueued time.Time
	// nodeKnown is false until the node's eligibility is first set: an unknown
	// node is not eligible, as in kube-proxy.
	nodeKnown, nodeEligible bool
}

// FamilyStatus is the health of one family's rules.
type FamilyStatus struct {
	// LastUpdated is when the family's last successful sync finished (zero before
	// the first).
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Status is the body of /healthz and /livez: kube-proxy's ProxyHealth.
type Status struct {
	// LastUpdated is, when healthy, the time of the answer (kube-proxy keeps this
	// for older clients, which read it as "the rules are current"); when not,
	// the latest successful sync of any family (zero before the first).
	LastUpdated time.Time `json:"lastUpdated"`
	// CurrentTime is the time of the answer.
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible (in /healthz only) is false while the node is unknown, being
	// deleted or drained by the cluster autoscaler, so that load balancers stop
	// sending traffic here.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when every family is, node eligibility aside.
	Healthy bool `json:"healthy"`
	// Families holds each family's health, by ip_family (IPv4, IPv6).
	Families map[string]FamilyStatus `json:"status,omitempty"`
}

// NewHealthzServer returns a HealthzServer that turns a family stale when a change
// has waited longer than timeout for it. clk defaults to the real clock; m may be
// nil. It is not ready until SetFamilies has named the families and each has
// synced.
func NewHealthzServer(timeout time.Duration, clk clock.PassiveClock, m *metrics.Metrics) *HealthzServer {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &HealthzServer{
		clock: clk, timeout: timeout, metrics: m,
		lastUpdated: map[string]time.Time{}, oldestPending: map[string]time.Time{},
	}
}

// SetFamilies names the families whose syncs the server waits for.
func (h *HealthzServer) SetFamilies(families ...knftables.Family) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.families = nil
	for _, fam := range families {
		h.families = append(h.families, metrics.Family(fam))
	}
}

// QueuedUpdate records that a change is waiting for a sync of every family.
func (h *HealthzServer) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.latestQueued = h.clock.Now()
	for _, f := range h.families {
		if _, ok := h.oldestPending[f]; !ok {
			h.oldestPending[f] = h.latestQueued
		}
	}
}

// Updated records a successful sync of fam that applied every change queued
// before it.
func (h *HealthzServer) Updated(fam knftables.Family) {
	h.UpdatedAsOf(fam, time.Time{})
}

// UpdatedAsOf records a successful sync of fam that read the cluster state at
// start: changes queued after start stay pending (counted from the newest of them,
// as only the oldest and newest times are kept). A zero start means every queued
// change was applied.
func (h *HealthzServer) UpdatedAsOf(fam knftables.Family, start time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := metrics.Family(fam)
	h.lastUpdated[f] = h.clock.Now()
	oldest, pending := h.oldestPending[f]
	switch {
	case !pending:
	case start.IsZero() || !h.latestQueued.After(start):
		delete(h.oldestPending, f)
	case !oldest.After(start):
		h.oldestPending[f] = h.latestQueued
	}
}

// SetNodeEligible records whether the node may receive load-balancer traffic.
func (h *HealthzServer) SetNodeEligible(eligible bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeKnown, h.nodeEligible = true, eligible
}

// Healthy reports whether no family is stale: /livez's answer, and what the
// health-check node ports report as serviceProxyHealthy.
func (h *HealthzServer) Healthy() bool {
	return h.status(false).Healthy
}

// Ready reports whether /healthz answers 200: every family synced and none
// stale, and the node eligible.
func (h *HealthzServer) Ready() bool {
	st := h.status(true)
	return st.Healthy && *st.NodeEligible
}

// status returns the body of /healthz (ready) or /livez. /healthz counts a family
// that has never synced as unhealthy; /livez does not, so that a proxier waiting
// for the API server is not restarted (it is stale once a change has waited
// longer than the timeout, synced or not).
func (h *HealthzServer) status(ready bool) Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock.Now()
	st := Status{CurrentTime: now, Healthy: !ready || len(h.families) > 0, Families: map[string]FamilyStatus{}}
	for _, f := range h.families {
		last := h.lastUpdated[f]
		if last.After(st.LastUpdated) {
			st.LastUpdated = last
		}
		oldest, pending := h.oldestPending[f]
		healthy := !pending || now.Sub(oldest) < h.timeout // kube-proxy: stale at the timeout
		if ready && last.IsZero() {
			healthy = false
		}
		st.Families[f] = FamilyStatus{LastUpdated: last, Healthy: healthy}
		st.Healthy = st.Healthy && healthy
	}
	if ready {
		eligible := h.nodeKnown && h.nodeEligible
		st.NodeEligible = &eligible
	}
	if st.Healthy && (st.NodeEligible == nil || *st.NodeEligible) {
		st.LastUpdated = now
	}
	return st
}

// Handler serves /healthz and /livez.
func (h *HealthzServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := h.status(true)
		h.answer(w, st.Healthy && *st.NodeEligible, st, h.counter(true))
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		st := h.status(false)
		h.answer(w, st.Healthy, st, h.counter(false))
	})
	return mux
}

func (h *HealthzServer) counter(healthz bool) *prometheus.CounterVec {
	switch {
	case h.metrics == nil:
		return nil
	case healthz:
		return h.metrics.HealthzRequests
	default:
		return h.metrics.LivezRequests
	}
}

func (h *HealthzServer) answer(w http.ResponseWriter, ok bool, st Status, count *prometheus.CounterVec) {
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	if count != nil {
		count.WithLabelValues(strconv.Itoa(code)).Inc()
	}
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
