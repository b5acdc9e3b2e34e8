// Package metrics holds the proxier's Prometheus metrics, in a registry of their own,
// and serves them. Metrics kube-proxy has carry its names, types, labels and buckets
// (kubeproxy_*), so that its dashboards and alerts keep working; nftproxy's own
// carry the nftproxy_ prefix.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/knftables"
)

// Subsystem prefixes the metrics kube-proxy also has; Namespace prefixes
// nftproxy's own.
const (
	Subsystem = "kubeproxy"
	Namespace = "nftproxy"
)

// ProxyMode is what /proxyMode answers, as kube-proxy in nftables mode does.
const ProxyMode = "nftables"

// Label values of the ip_family label: kube-proxy's (core/v1 IPFamily).
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Label values of nftproxy's sync type label.
const (
	SyncFull    = "full"
	SyncPartial = "partial"
)

// Label values of the traffic_policy label.
const (
	PolicyInternal = "internal"
	PolicyExternal = "external"
)

// Family returns the ip_family label value of an nftables family.
func Family(fam knftables.Family) string {
	if fam == knftables.IPv6Family {
		return IPv6
	}
	return IPv4
}

// Metrics is the proxier's set of metrics. Every field is registered in Registry.
type Metrics struct {
	Registry *prometheus.Registry

	// SyncDuration is the time each family's sync took (kube-proxy's
	// sync_proxy_rules_duration_seconds); SyncFullDuration and
	// SyncPartialDuration split it by kind of sync.
	SyncDuration        *prometheus.HistogramVec
	SyncFullDuration    *prometheus.HistogramVec
	SyncPartialDuration *prometheus.HistogramVec
	// NetworkProgrammingDuration is the time from the change an EndpointSlice's
	// last-change-trigger-time records to the sync that applied the slice.
	NetworkProgrammingDuration *prometheus.HistogramVec
	// LastSyncTimestamp is when a family's last successful sync finished.
	LastSyncTimestamp *prometheus.GaugeVec
	// LastQueuedTimestamp is when the last change was queued for sync.
	LastQueuedTimestamp *prometheus.GaugeVec
	// EndpointChangesPending and ServiceChangesPending are the changes received
	// and not yet taken by a sync; the Total counters count every change.
	EndpointChangesPending prometheus.Gauge
	EndpointChangesTotal   prometheus.Counter
	ServiceChangesPending  prometheus.Gauge
	ServiceChangesTotal    prometheus.Counter
	// NoLocalEndpoints is the number of Service ports with a Local traffic policy
	// that have endpoints, none of them on this node, by traffic_policy and family.
	NoLocalEndpoints *prometheus.GaugeVec
	// SyncFailures counts failed syncs of a family's table.
	SyncFailures *prometheus.CounterVec
	// CleanupFailures counts failed removals of the emptied objects kept by
	// incremental syncs (Proxier.Tidy).
	CleanupFailures *prometheus.CounterVec
	// ConntrackDuration is the time each family's stale conntrack cleanup took,
	// and ConntrackDeleted the entries it deleted.
	ConntrackDuration *prometheus.HistogramVec
	ConntrackDeleted  *prometheus.CounterVec
	// HealthzRequests and LivezRequests count the health server's answers by code.
	HealthzRequests *prometheus.CounterVec
	LivezRequests   *prometheus.CounterVec

	// nftproxy's own.

	// SyncOperations is the number of nft operations in each transaction, by
	// family and sync type.
	SyncOperations *prometheus.HistogramVec
	// Services, Endpoints and TableObjects describe each family's table after the
	// last successful sync.
	Services     *prometheus.GaugeVec
	Endpoints    *prometheus.GaugeVec
	TableObjects *prometheus.GaugeVec
	// InvalidObjects counts the objects currently ignored as invalid, by kind.
	InvalidObjects *prometheus.GaugeVec
}

// syncBuckets are kube-proxy's sync buckets: 1 ms doubling to about 16 s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's network programming buckets: 0.25 s steps to
// 0.5 s, 1 s steps to 59 s, 5 s steps to 115 s, then 30 s steps to 5 minutes.
func programmingBuckets() []float64 {
	var b []float64
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// family is the label of per-family metrics.
var family = []string{"ip_family"}

func kubeHistogram(name, help string, buckets []float64) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: Subsystem, Name: name, Help: help, Buckets: buckets,
	}, family)
}

func kubeGauge(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: Subsystem, Name: name, Help: help}, labels)
}

func kubeCounter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: Subsystem, Name: name, Help: help}, labels)
}

func ownGauge(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

// New returns the metrics, registered in a new registry together with the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry:            prometheus.NewRegistry(),
		SyncDuration:        kubeHistogram("sync_proxy_rules_duration_seconds", "Time a sync of a family's proxy rules took, full or partial, in seconds.", syncBuckets),
		SyncFullDuration:    kubeHistogram("sync_full_proxy_rules_duration_seconds", "Time a full sync of a family's proxy rules took, in seconds.", syncBuckets),
		SyncPartialDuration: kubeHistogram("sync_partial_proxy_rules_duration_seconds", "Time a partial sync of a family's proxy rules took, in seconds.", syncBuckets),
		NetworkProgrammingDuration: kubeHistogram("network_programming_duration_seconds",
			"Time from a change recorded in an EndpointSlice's last-change-trigger-time to the sync that applied it, in seconds.", programmingBuckets()),
		LastSyncTimestamp:   kubeGauge("sync_proxy_rules_last_timestamp_seconds", "Unix time of a family's last successful sync.", family...),
		LastQueuedTimestamp: kubeGauge("sync_proxy_rules_last_queued_timestamp_seconds", "Unix time at which the last sync was queued.", family...),
		EndpointChangesPending: prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: Subsystem,
			Name: "sync_proxy_rules_endpoint_changes_pending", Help: "EndpointSlice changes received and not yet synced."}),
		EndpointChangesTotal: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: Subsystem,
			Name: "sync_proxy_rules_endpoint_changes_total", Help: "EndpointSlice changes received."}),
		ServiceChangesPending: prometheus.NewGauge(prometheus.GaugeOpts{Subsystem: Subsystem,
			Name: "sync_proxy_rules_service_changes_pending", Help: "Services changed and not yet synced."}),
		ServiceChangesTotal: prometheus.NewCounter(prometheus.CounterOpts{Subsystem: Subsystem,
			Name: "sync_proxy_rules_service_changes_total", Help: "Service changes received."}),
		NoLocalEndpoints: kubeGauge("sync_proxy_rules_no_local_endpoints_total",
			"Service ports with a Local traffic policy whose endpoints are all on other nodes.", "traffic_policy", "ip_family"),
		SyncFailures:      kubeCounter("sync_proxy_rules_nftables_sync_failures_total", "Failed syncs of a family's table.", family...),
		CleanupFailures:   kubeCounter("sync_proxy_rules_nftables_cleanup_failures_total", "Failed removals of the emptied objects kept by incremental syncs.", family...),
		ConntrackDuration: kubeHistogram("conntrack_reconciler_sync_duration_seconds", "Time a family's stale conntrack cleanup took, in seconds.", syncBuckets),
		ConntrackDeleted:  kubeCounter("conntrack_reconciler_deleted_entries_total", "Stale conntrack entries deleted.", family...),
		HealthzRequests:   kubeCounter("proxy_healthz_total", "Answers of /healthz, by HTTP code.", "code"),
		LivezRequests:     kubeCounter("proxy_livez_total", "Answers of /livez, by HTTP code.", "code"),

		SyncOperations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "sync_operations",
			Help:    "Number of nft operations in each transaction, by family and type (full or partial).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 12),
		}, []string{"ip_family", "type"}),
		Services:       ownGauge("services", "Number of Services with a ClusterIP of the family.", family...),
		Endpoints:      ownGauge("endpoints", "Number of distinct endpoint address:port pairs of the family.", family...),
		TableObjects:   ownGauge("table_objects", "Number of chains, rules, sets, maps and elements in the family's table.", family...),
		InvalidObjects: ownGauge("invalid_objects", "Number of objects ignored because they are invalid, by kind.", "kind"),
	}
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.SyncDuration, m.SyncFullDuration, m.SyncPartialDuration, m.NetworkProgrammingDuration,
		m.LastSyncTimestamp, m.LastQueuedTimestamp,
		m.EndpointChangesPending, m.EndpointChangesTotal, m.ServiceChangesPending, m.ServiceChangesTotal,
		m.NoLocalEndpoints, m.SyncFailures, m.CleanupFailures, m.ConntrackDuration, m.ConntrackDeleted,
		m.HealthzRequests, m.LivezRequests,
		m.SyncOperations, m.Services, m.Endpoints, m.TableObjects, m.InvalidObjects,
	)
	return m
}

// Init creates the series of every per-family metric of families, and of the
// health counters' codes, at zero: kube-proxy's alerts compute rates and ratios
// over them, which need a series before the first event.
func (m *Metrics) Init(families []knftables.Family) {
	for _, fam := range families {
		f := Family(fam)
		m.SyncFailures.WithLabelValues(f)
		m.CleanupFailures.WithLabelValues(f)
		m.ConntrackDeleted.WithLabelValues(f)
		m.NoLocalEndpoints.WithLabelValues(PolicyInternal, f)
		m.NoLocalEndpoints.WithLabelValues(PolicyExternal, f)
	}
	for _, code := range []string{"200", "503"} {
		m.HealthzRequests.WithLabelValues(code)
		m.LivezRequests.WithLabelValues(code)
	}
}

// ObserveSync records a family's sync of the given kind that took d.
func (m *Metrics) ObserveSync(fam knftables.Family, full bool, d time.Duration) {
	f := Family(fam)
	m.SyncDuration.WithLabelValues(f).Observe(d.Seconds())
	if full {
		m.SyncFullDuration.WithLabelValues(f).Observe(d.Seconds())
	} else {
		m.SyncPartialDuration.WithLabelValues(f).Observe(d.Seconds())
	}
}

// SyncType returns SyncFull or SyncPartial.
func SyncType(full bool) string {
	if full {
		return SyncFull
	}
	return SyncPartial
}

// UnixSeconds is t as a timestamp gauge's value.
func UnixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Handler serves what kube-proxy serves on its metrics address that applies:
// /metrics (the registry, in the Prometheus text format), /healthz (the server
// is up: "ok") and /proxyMode.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, ProxyMode)
	})
	return mux
}

// WithProfiling returns h with Go's profiling handlers added under /debug/pprof/
// (the index and the runtime's profiles, profile, symbol and trace, as kube-proxy
// serves them on its metrics address when profiling is enabled).
func WithProfiling(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/debug/pprof", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/debug/pprof/", http.StatusFound)
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Serve serves Handler on l until ctx is done, then shuts the server down.
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
