package metrics

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/knftables"
)

// declared is what a metric's declaration fixes: its type, label names (sorted)
// and, for a histogram, its bucket upper bounds.
type declared struct {
	typ     dto.MetricType
	labels  []string
	buckets []float64
}

const (
	counter   = dto.MetricType_COUNTER
	gauge     = dto.MetricType_GAUGE
	histogram = dto.MetricType_HISTOGRAM
)

var (
	kubeSyncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)
	kubeProgBuckets = slices.Concat(prometheus.LinearBuckets(0.25, 0.25, 2), prometheus.LinearBuckets(1, 1, 59),
		prometheus.LinearBuckets(60, 5, 12), prometheus.LinearBuckets(120, 30, 7))
	ipFamily = []string{"ip_family"}
)

// implemented are kube-proxy v1.37.2's metrics that nftproxy exposes, as
// k8s.io/kubernetes/pkg/proxy/metrics declares them.
var implemented = map[string]declared{
	"kubeproxy_sync_proxy_rules_duration_seconds":                {histogram, ipFamily, kubeSyncBuckets},
	"kubeproxy_sync_full_proxy_rules_duration_seconds":           {histogram, ipFamily, kubeSyncBuckets},
	"kubeproxy_sync_partial_proxy_rules_duration_seconds":        {histogram, ipFamily, kubeSyncBuckets},
	"kubeproxy_network_programming_duration_seconds":             {histogram, ipFamily, kubeProgBuckets},
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds":          {gauge, ipFamily, nil},
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds":   {gauge, ipFamily, nil},
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending":        {gauge, nil, nil},
	"kubeproxy_sync_proxy_rules_endpoint_changes_total":          {counter, nil, nil},
	"kubeproxy_sync_proxy_rules_service_changes_pending":         {gauge, nil, nil},
	"kubeproxy_sync_proxy_rules_service_changes_total":           {counter, nil, nil},
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total":        {gauge, []string{"ip_family", "traffic_policy"}, nil},
	"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":    {counter, ipFamily, nil},
	"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": {counter, ipFamily, nil},
	"kubeproxy_proxy_healthz_total":                              {counter, []string{"code"}, nil},
	"kubeproxy_proxy_livez_total":                                {counter, []string{"code"}, nil},
	"kubeproxy_conntrack_reconciler_sync_duration_seconds":       {histogram, ipFamily, kubeSyncBuckets},
	"kubeproxy_conntrack_reconciler_deleted_entries_total":       {counter, ipFamily, nil},
}

// notApplicable are kube-proxy v1.37.2's metrics nftproxy does not expose, and
// why (README.md's table says the same).
var notApplicable = map[string]string{
	"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":             "iptables and ipvs modes",
	"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total":     "iptables mode",
	"kubeproxy_sync_proxy_rules_iptables_total":                              "iptables mode",
	"kubeproxy_sync_proxy_rules_iptables_last":                               "iptables mode",
	"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":              "iptables mode (nfacct)",
	"kubeproxy_iptables_localhost_nodeports_accepted_packets_total":          "iptables mode (nfacct)",
	"kubeproxy_sync_proxy_rules_winkernel_lb_create_failures_total":          "Windows",
	"kubeproxy_sync_proxy_rules_winkernel_lb_update_failures_total":          "Windows",
	"kubeproxy_sync_proxy_rules_winkernel_lb_delete_failures_total":          "Windows",
	"kubeproxy_nftables_localhost_nodeport_listeners":                        "no localhost NodePorts (KubeProxyNFTablesLocalhostNodePorts)",
	"kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total": "no localhost NodePorts",
	"kubeproxy_nftables_localhost_nodeport_rejected_packets_total":           "no localhost NodePorts",
}

var families = []knftables.Family{knftables.IPv4Family, knftables.IPv6Family}

// touched returns metrics with a series in every per-family vector.
func touched() *Metrics {
	m := New()
	m.Init(families)
	for _, fam := range families {
		f := Family(fam)
		m.ObserveSync(fam, true, 0)
		m.ObserveSync(fam, false, 0)
		m.NetworkProgrammingDuration.WithLabelValues(f).Observe(1.5)
		m.LastSyncTimestamp.WithLabelValues(f).Set(1.7e9)
		m.LastQueuedTimestamp.WithLabelValues(f).Set(1.7e9)
		m.ConntrackDuration.WithLabelValues(f).Observe(0.002)
		m.SyncOperations.WithLabelValues(f, SyncPartial).Observe(3)
		m.Services.WithLabelValues(f).Set(4)
		m.Endpoints.WithLabelValues(f).Set(5)
		m.TableObjects.WithLabelValues(f).Set(6)
	}
	m.InvalidObjects.WithLabelValues("Service").Set(8)
	return m
}

// get serves m on a loopback port and returns the code and body of path.
func get(t *testing.T, m *Metrics, path string) (int, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve after shutdown: %v", err)
		}
	}()
	resp, err := http.Get("http://" + l.Addr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// scrape returns the metric families of one scrape of m over HTTP.
func scrape(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	code, text := get(t, m, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse scrape: %v\n%s", err, text)
	}
	return mfs
}

// observed returns what a scraped family shows of its declaration.
func observed(mf *dto.MetricFamily) declared {
	d := declared{typ: mf.GetType()}
	if len(mf.GetMetric()) == 0 {
		return d
	}
	m := mf.GetMetric()[0]
	for _, l := range m.GetLabel() {
		d.labels = append(d.labels, l.GetName())
	}
	slices.Sort(d.labels)
	for _, b := range m.GetHistogram().GetBucket() {
		if ub := b.GetUpperBound(); ub < 1e308 { // +Inf is implicit
			d.buckets = append(d.buckets, ub)
		}
	}
	return d
}

func (d declared) equal(o declared) bool {
	return d.typ == o.typ && slices.Equal(d.labels, o.labels) && slices.Equal(d.buckets, o.buckets)
}

func TestScrapeHasKubeProxysMetrics(t *testing.T) {
	mfs := scrape(t, touched())
	for name, want := range implemented {
		mf, ok := mfs[name]
		if !ok {
			t.Errorf("scrape lacks %s", name)
			continue
		}
		if got := observed(mf); !got.equal(want) {
			t.Errorf("%s: scraped %v, want kube-proxy's %v", name, got, want)
		}
	}
	for name := range mfs {
		switch {
		case strings.HasPrefix(name, Subsystem+"_"):
			if _, ok := implemented[name]; !ok {
				t.Errorf("%s is not one of kube-proxy's metrics: name it nftproxy_", name)
			}
		case strings.HasPrefix(name, Namespace+"_"), strings.HasPrefix(name, "go_"), strings.HasPrefix(name, "process_"),
			strings.HasPrefix(name, "promhttp_"):
		default:
			t.Errorf("unexpected metric %s", name)
		}
	}
	for _, name := range []string{"go_goroutines", "process_start_time_seconds", "nftproxy_sync_operations", "nftproxy_table_objects"} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("scrape lacks %s", name)
		}
	}
	// The ip_family values are kube-proxy's.
	for _, m := range mfs["kubeproxy_sync_proxy_rules_nftables_sync_failures_total"].GetMetric() {
		if v := m.GetLabel()[0].GetValue(); v != IPv4 && v != IPv6 {
			t.Errorf("ip_family %q, want IPv4 or IPv6", v)
		}
	}
}

func TestInitExposesZeroSeries(t *testing.T) {
	m := New()
	m.Init([]knftables.Family{knftables.IPv4Family})
	mfs := scrape(t, m)
	for _, name := range []string{
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total",
		"kubeproxy_conntrack_reconciler_deleted_entries_total",
		"kubeproxy_proxy_healthz_total",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total",
	} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("a fresh scrape lacks %s", name)
		}
	}
	if n := len(mfs["kubeproxy_sync_proxy_rules_no_local_endpoints_total"].GetMetric()); n != 2 {
		t.Errorf("no_local_endpoints_total has %d series for one family, want 2 (internal, external)", n)
	}
}

func TestMetricsAddressServesProxyModeAndHealthz(t *testing.T) {
	m := New()
	for path, want := range map[string]string{"/proxyMode": "nftables", "/healthz": "ok"} {
		if code, body := get(t, m, path); code != http.StatusOK || body != want {
			t.Errorf("GET %s = %d %q, want 200 %q", path, code, body, want)
		}
	}
}

// TestProfilingHandlers serves the metrics address with the profiling handlers
// and checks that pprof answers beside the metrics, as kube-proxy's --profiling
// has it, and that the plain handler has no pprof.
func TestProfilingHandlers(t *testing.T) {
	m := New()
	srv := httptest.NewServer(WithProfiling(m.Handler()))
	defer srv.Close()
	for path, want := range map[string]int{
		"/debug/pprof/":                  http.StatusOK,
		"/debug/pprof/heap?debug=1":      http.StatusOK,
		"/debug/pprof/goroutine?debug=1": http.StatusOK,
		"/debug/pprof/symbol":            http.StatusOK,
		"/debug/pprof/profile?seconds=1": http.StatusOK,
		"/debug/pprof/cmdline":           http.StatusNotFound, // kube-proxy does not serve it either
		"/metrics":                       http.StatusOK,
		"/proxyMode":                     http.StatusOK,
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s = %d, want %d", path, resp.StatusCode, want)
		}
	}
	if code, _ := get(t, m, "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("the plain handler serves /debug/pprof/: %d", code)
	}
}

// TestDeclarationsAreUpstreams reads kube-proxy's declarations from its source in
// the module cache and checks that each of its metrics is either implemented with
// the same type, labels and buckets, or listed as not applicable.
func TestDeclarationsAreUpstreams(t *testing.T) {
	src := upstreamMetricsSource(t)
	got := parseUpstream(t, src)
	if len(got) < 20 {
		t.Fatalf("read only %d declarations from %s", len(got), src)
	}
	for name, d := range got {
		want, ok := implemented[name]
		_, na := notApplicable[name]
		switch {
		case ok && !d.equal(want):
			t.Errorf("%s: upstream declares %v, we expose %v", name, d, want)
		case !ok && !na:
			t.Errorf("upstream metric %s is neither implemented nor listed as not applicable", name)
		}
	}
	for name := range implemented {
		if _, ok := got[name]; !ok {
			t.Errorf("%s is not declared upstream", name)
		}
	}
	for name := range notApplicable {
		if _, ok := got[name]; !ok {
			t.Errorf("not-applicable %s is not declared upstream", name)
		}
	}
}

// upstreamMetricsSource returns the path of kube-proxy v1.37.2's
// pkg/proxy/metrics/metrics.go in the module cache, or skips.
func upstreamMetricsSource(t *testing.T) string {
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			t.Skipf("go env GOMODCACHE: %v", err)
		}
		cache = strings.TrimSpace(string(out))
	}
	src := filepath.Join(cache, "k8s.io", "kubernetes@v1.37.2", "pkg", "proxy", "metrics", "metrics.go")
	if _, err := os.Stat(src); err != nil {
		t.Skipf("kube-proxy's source is not in the module cache: %v", err)
	}
	return src
}

// parseUpstream reads every metric declaration of a file written as kube-proxy's
// pkg/proxy/metrics: metrics.NewX(&metrics.XOpts{Subsystem, Name, Buckets}, labels)
// and metrics.NewDesc(name, help, labels, ...).
func parseUpstream(t *testing.T, src string) map[string]declared {
	f, err := parser.ParseFile(token.NewFileSet(), src, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	out := map[string]declared{}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			for i, id := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := stringLit(vs.Values[i]); ok {
						consts[id.Name] = s
					}
				}
			}
		}
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		switch fn := sel.Sel.Name; fn {
		case "NewDesc":
			name, _ := stringLit(call.Args[0])
			d := declared{typ: counter, labels: stringList(call.Args[2])}
			out[name] = d
		case "NewCounter", "NewCounterVec", "NewGauge", "NewGaugeVec", "NewHistogram", "NewHistogramVec":
			opts := call.Args[0].(*ast.UnaryExpr).X.(*ast.CompositeLit)
			var sub, name string
			d := declared{typ: map[string]dto.MetricType{"Counter": counter, "Gauge": gauge, "Histogram": histogram}[strings.TrimSuffix(strings.TrimPrefix(fn, "New"), "Vec")]}
			for _, e := range opts.Elts {
				kv := e.(*ast.KeyValueExpr)
				switch kv.Key.(*ast.Ident).Name {
				case "Subsystem":
					sub = consts[kv.Value.(*ast.Ident).Name]
				case "Name":
					name, _ = stringLit(kv.Value)
				case "Buckets":
					d.buckets = evalBuckets(t, kv.Value)
				}
			}
			if len(call.Args) > 1 {
				d.labels = stringList(call.Args[1])
			}
			out[sub+"_"+name] = d
		}
		return true
	})
	return out
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

// stringList returns the sorted strings of a []string{...} literal (nil for nil).
func stringList(e ast.Expr) []string {
	cl, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil
	}
	var out []string
	for _, el := range cl.Elts {
		s, _ := stringLit(el)
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// evalBuckets evaluates metrics.ExponentialBuckets, LinearBuckets and
// MergeBuckets calls with literal arguments.
func evalBuckets(t *testing.T, e ast.Expr) []float64 {
	t.Helper()
	call := e.(*ast.CallExpr)
	fn := call.Fun.(*ast.SelectorExpr).Sel.Name
	if fn == "MergeBuckets" {
		var out []float64
		for _, a := range call.Args {
			out = append(out, evalBuckets(t, a)...)
		}
		return out
	}
	var args []float64
	for _, a := range call.Args {
		v, err := strconv.ParseFloat(a.(*ast.BasicLit).Value, 64)
		if err != nil {
			t.Fatalf("bucket argument %v: %v", a, err)
		}
		args = append(args, v)
	}
	switch fn {
	case "ExponentialBuckets":
		return prometheus.ExponentialBuckets(args[0], args[1], int(args[2]))
	case "LinearBuckets":
		return prometheus.LinearBuckets(args[0], args[1], int(args[2]))
	}
	t.Fatalf("unknown bucket function %s", fn)
	return nil
}
