// Package metrics holds the proxier's Prometheus metrics, in a registry of their own,
// and serves them. Names mirror kube-proxy's where the meaning is the same, with the
// nftproxy_ prefix.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric name.
const Namespace = "nftproxy"

// Label values of the sync type label.
const (
	SyncFull    = "full"
	SyncPartial = "partial"
)

// Label values of the traffic policy label.
const (
	PolicyInternal = "internal"
	PolicyExternal = "external"
)

// Metrics is the proxier's set of metrics. Every field is registered in Registry.
type Metrics struct {
	Registry *prometheus.Registry

	// SyncDuration is the time a sync took, by type (full or partial).
	SyncDuration *prometheus.HistogramVec
	// NetworkProgrammingDuration is the time from a change of a Service or
	// EndpointSlice to the sync that applied it.
	NetworkProgrammingDuration prometheus.Histogram
	// LastSyncTimestamp is when the last successful sync finished.
	LastSyncTimestamp prometheus.Gauge
	// LastQueuedTimestamp is when the last change was queued for sync.
	LastQueuedTimestamp prometheus.Gauge
	// SyncFailures counts failed syncs, by family.
	SyncFailures *prometheus.CounterVec
	// SyncOperations is the number of nft operations in each transaction, by family
	// and sync type.
	SyncOperations *prometheus.HistogramVec
	// Services, Endpoints and TableObjects describe each family's table after the
	// last successful sync.
	Services     *prometheus.GaugeVec
	Endpoints    *prometheus.GaugeVec
	TableObjects *prometheus.GaugeVec
	// ServicesWithoutLocalEndpoints counts Service ports with a Local traffic policy
	// (internal or external) that have endpoints, none of them on this node.
	ServicesWithoutLocalEndpoints *prometheus.GaugeVec
	// InvalidObjects counts the objects currently ignored as invalid, by kind.
	InvalidObjects *prometheus.GaugeVec
	// ServiceChanges and EndpointChanges count the change events received.
	ServiceChanges  prometheus.Counter
	EndpointChanges prometheus.Counter
	// ConntrackCleared counts conntrack entries deleted as stale.
	ConntrackCleared prometheus.Counter
	// HealthzRequests and LivezRequests count the health server's answers by code.
	HealthzRequests *prometheus.CounterVec
	LivezRequests   *prometheus.CounterVec
}

// syncBuckets span 1 ms to about 16 s, as a sync of a large table can take seconds.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's network programming buckets: 0.25 s steps to
// 1 s, then 1 s steps to a minute, then coarser to 5 minutes.
func programmingBuckets() []float64 {
	b := []float64{0.25, 0.5}
	for s := 1.0; s <= 59; s++ {
		b = append(b, s)
	}
	for s := 60.0; s < 120; s += 5 {
		b = append(b, s)
	}
	for s := 120.0; s <= 300; s += 30 {
		b = append(b, s)
	}
	return b
}

// New returns the metrics, registered in a new registry together with the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "sync_proxy_rules_duration_seconds",
			Help:    "Time a sync of the proxy rules took, by type (full or partial).",
			Buckets: syncBuckets,
		}, []string{"type"}),
		NetworkProgrammingDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "network_programming_duration_seconds",
			Help:    "Time from a change of a Service or EndpointSlice (its last-change-trigger-time, else its arrival) to the sync that applied it.",
			Buckets: programmingBuckets(),
		}),
		LastSyncTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "Unix time at which the last successful sync finished.",
		}),
		LastQueuedTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "Unix time at which the last change was queued for sync.",
		}),
		SyncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "sync_failures_total",
			Help: "Number of failed syncs of a family's table.",
		}, []string{"family"}),
		SyncOperations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "sync_operations",
			Help:    "Number of nft operations in each transaction, by family and type (full or partial).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 12),
		}, []string{"family", "type"}),
		Services: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "services",
			Help: "Number of Services with an address of the family.",
		}, []string{"family"}),
		Endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "endpoints",
			Help: "Number of distinct endpoint address:port pairs of the family.",
		}, []string{"family"}),
		TableObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "table_objects",
			Help: "Number of chains, rules, sets, maps and elements in the family's table.",
		}, []string{"family"}),
		ServicesWithoutLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "services_without_local_endpoints",
			Help: "Number of Service ports with a Local traffic policy whose endpoints are all on other nodes, by traffic_policy (internal or external).",
		}, []string{"traffic_policy"}),
		InvalidObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "invalid_objects",
			Help: "Number of objects ignored because they are invalid, by kind.",
		}, []string{"kind"}),
		ServiceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "sync_proxy_rules_service_changes_total",
			Help: "Number of Service changes received.",
		}),
		EndpointChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Number of EndpointSlice changes received.",
		}),
		ConntrackCleared: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "conntrack_stale_entries_deleted_total",
			Help: "Number of stale UDP conntrack entries deleted.",
		}),
		HealthzRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "healthz_total",
			Help: "Answers of /healthz, by HTTP code.",
		}, []string{"code"}),
		LivezRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "livez_total",
			Help: "Answers of /livez, by HTTP code.",
		}, []string{"code"}),
	}
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.SyncDuration, m.NetworkProgrammingDuration, m.LastSyncTimestamp, m.LastQueuedTimestamp,
		m.SyncFailures, m.SyncOperations, m.Services, m.Endpoints, m.TableObjects,
		m.ServicesWithoutLocalEndpoints, m.InvalidObjects, m.ServiceChanges, m.EndpointChanges,
		m.ConntrackCleared, m.HealthzRequests, m.LivezRequests,
	)
	return m
}

// SyncType returns SyncFull or SyncPartial.
func SyncType(full bool) string {
	if full {
		return SyncFull
	}
	return SyncPartial
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	return mux
}

// Serve serves /metrics on l until ctx is done, then shuts the server down.
func (m *Metrics) Serve(ctx context.Context, l net.Listener) error {
	return ServeHTTP(ctx, l, m.Handler())
}

// ServeHTTP serves h on l until ctx is done, then shuts the server down gracefully
// (for at most five seconds). It returns nil after a shutdown.
func ServeHTTP(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
