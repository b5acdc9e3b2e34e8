package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// fakeTables opens knftables Fakes and keeps them by family.
type fakeTables struct {
	mu sync.Mutex
	m  map[knftables.Family]*knftables.Fake
}

func (f *fakeTables) newNFT(family knftables.Family, table string) (knftables.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[knftables.Family]*knftables.Fake{}
	}
	if f.m[family] == nil {
		f.m[family] = knftables.NewFake(family, table)
	}
	return f.m[family], nil
}

func (f *fakeTables) get(family knftables.Family) *knftables.Fake {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[family]
}

// hasServiceIP reports whether the family's Fake dispatches key in chain service-ips
// (has it in one of the chain's class sets).
func (f *fakeTables) hasServiceIP(family knftables.Family, key ...string) bool {
	fk := f.get(family)
	if fk == nil {
		return false
	}
	fk.RLock()
	defer fk.RUnlock()
	if fk.Table == nil {
		return false
	}
	for name, set := range fk.Table.Sets {
		if c, _, ok := ruleset.ClassOf(name); ok && c == ruleset.ChainServiceIPs && set.FindElement(key...) != nil {
			return true
		}
	}
	return false
}

func TestCleanupFlagRemovesBothTables(t *testing.T) {
	tables := &fakeTables{}
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, _ := tables.newNFT(fam, "kp")
		tx := nft.NewTransaction()
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: "services"})
		if err := nft.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
	}
	var stderr bytes.Buffer
	d := deps{newNFT: tables.newNFT, newClient: func(*Options) (kubernetes.Interface, error) {
		t.Fatal("--cleanup connected to the API server")
		return nil, nil
	}}
	if code := run(context.Background(), []string{"--cleanup", "--table-name=kp", "--hostname-override=n"}, &stderr, d); code != 0 {
		t.Fatalf("--cleanup exited %d: %s", code, stderr.String())
	}
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		if dump := tables.get(fam).Dump(); dump != "" {
			t.Errorf("table %s kp left after --cleanup:\n%s", fam, dump)
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"--cluster-cidr=10.0.0.0/99"}, &stderr, deps{})
	if code != 1 || !strings.Contains(stderr.String(), "clusterCIDR (--cluster-cidr)") {
		t.Errorf("exit %d, stderr %q; want 1 and a message naming clusterCIDR", code, stderr.String())
	}
}

// TestMain removes the binary buildBinary made, if any.
func TestMain(m *testing.M) {
	code := m.Run()
	if !built {
		os.Exit(code)
	}
	if bin, err := buildBinary(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// built is true once buildBinary ran.
var built bool

// buildBinary builds the daemon once per test binary run.
var buildBinary = sync.OnceValues(func() (string, error) {
	built = true
	dir, err := os.MkdirTemp("", "nftproxy-bin-")
	if err != nil {
		return "", err
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "nftproxy")
	out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

func TestBinaryExitsWithAMessageOnBadConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		file string
		args []string
		want string
	}{
		{"unknown field", "apiVersion: nftproxy.io/v1alpha1\nkind: NftproxyConfiguration\nmasqueradeAl: true\n", nil, `unknown field "masqueradeAl"`},
		{"bad CIDR", "apiVersion: nftproxy.io/v1alpha1\nkind: NftproxyConfiguration\nclusterCIDR: 10.0.0.0/8,fd01::/129\n", nil, `clusterCIDR (--cluster-cidr): invalid CIDR "fd01::/129"`},
		{"bad mode flag", "", []string{"--detect-local-mode=Bridge"}, `detectLocalMode (--detect-local-mode): "Bridge"`},
		{"bad duration flag", "", []string{"--min-sync-period=fast"}, `minSyncPeriod (--min-sync-period): invalid duration "fast"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			if c.file != "" {
				args = append(args, "--config", writeConfig(t, c.file))
			}
			cmd := exec.Command(bin, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			exitErr, ok := err.(*exec.ExitError)
			if !ok || exitErr.ExitCode() != 1 {
				t.Fatalf("nftproxy %q: %v, want exit code 1 (stderr %q)", args, err, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.want) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), c.want)
			}
		})
	}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func testService(name, ip string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, ResourceVersion: "1"},
		Spec: v1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Type: v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}}},
	}
}

func testSlice(svc, ip string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: svc + "-1", ResourceVersion: "1",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, NodeName: ptr.To("node-a")}},
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestDaemonWithFakeAPIServer runs the whole daemon in-process against client-go's
// fake clientset and knftables Fakes: informers feed the proxier, changes reach the
// tables, and the healthz and metrics servers answer.
func TestDaemonWithFakeAPIServer(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "1"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.10"}}}}
	cs := fake.NewClientset(node, testService("web", "172.30.0.10"), testSlice("web", "10.1.0.5"))
	tables := &fakeTables{}
	d := deps{newNFT: tables.newNFT, newClient: func(*Options) (kubernetes.Interface, error) { return cs, nil }}
	healthz, metricsAddr := freeAddr(t), freeAddr(t)
	args := []string{"--hostname-override=node-a", "--cluster-cidr=10.0.0.0/8", "--min-sync-period=0s",
		"--healthz-bind-address=" + healthz, "--metrics-bind-address=" + metricsAddr, "--table-name=nftproxy-test", "--profiling"}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &stderr, d) }()

	eventually(t, "web's ClusterIP in service-ips", func() bool {
		return tables.hasServiceIP(knftables.IPv4Family, "172.30.0.10", "tcp", "80")
	})
	// A new Service and its slice arrive through the watch.
	if _, err := cs.CoreV1().Services("default").Create(ctx, testService("api", "172.30.0.11"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, testSlice("api", "10.1.0.6"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "api's ClusterIP in service-ips", func() bool {
		return tables.hasServiceIP(knftables.IPv4Family, "172.30.0.11", "tcp", "80")
	})
	// Ready once both families have synced and the Node is known.
	eventually(t, "/healthz 200", func() bool {
		code, body := httpGet(t, "http://"+healthz+"/healthz")
		return code == http.StatusOK && strings.Contains(body, `"nodeEligible":true`)
	})
	if code, _ := httpGet(t, "http://"+healthz+"/livez"); code != http.StatusOK {
		t.Errorf("/livez = %d, want 200", code)
	}
	_, text := httpGet(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		`nftproxy_services{ip_family="IPv4"} 2`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_service_changes_total 2`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total 2`,
		`kubeproxy_proxy_livez_total{code="200"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if code, mode := httpGet(t, "http://"+metricsAddr+"/proxyMode"); code != http.StatusOK || mode != "nftables" {
		t.Errorf("/proxyMode = %d %q, want nftables", code, mode)
	}
	// --profiling: the daemon's own goroutines, through pprof on the metrics address.
	if code, body := httpGet(t, "http://"+metricsAddr+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "runDaemon") {
		t.Errorf("/debug/pprof/goroutine = %d, want 200 with the daemon's goroutines", code)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("daemon exited %d after shutdown: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not stop after its context was cancelled")
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("daemon log:\n%s", stderr.String())
	}
}

// TestDaemonUnreachableAPIServerIsNotReady runs the daemon, with its real API
// client, against an API server that is not there (a closed loopback port): it
// cannot sync, so /healthz answers 503 (and counts it), while /livez answers 200
// as kube-proxy's does, so that the kubelet does not restart a proxy waiting for
// the API server.
func TestDaemonUnreachableAPIServerIsNotReady(t *testing.T) {
	if os.Getenv(ownProcessEnv) == "" {
		inOwnProcess(t)
		return
	}
	tables := &fakeTables{}
	d := deps{newNFT: tables.newNFT, newClient: newClient}
	healthz, metricsAddr := freeAddr(t), freeAddr(t)
	args := []string{"--master=http://" + freeAddr(t), "--hostname-override=node-a", "--cluster-cidr=10.0.0.0/8",
		"--healthz-bind-address=" + healthz, "--metrics-bind-address=" + metricsAddr, "--table-name=nftproxy-test"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &stderr, d) }()

	var code int
	var body string
	eventually(t, "the healthz server", func() bool {
		resp, err := http.Get("http://" + healthz + "/healthz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, string(raw)
		return true
	})
	if code != http.StatusServiceUnavailable {
		t.Errorf("/healthz before any sync = %d %s, want 503", code, body)
	}
	for _, want := range []string{`"lastUpdated":"0001-01-01T00:00:00Z"`, `"nodeEligible":false`, `"healthy":false`} {
		if !strings.Contains(body, want) {
			t.Errorf("/healthz body %s lacks %s", body, want)
		}
	}
	time.Sleep(200 * time.Millisecond) // let the client fail a few times
	if code, body := httpGet(t, "http://"+healthz+"/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("/healthz after failed lists = %d %s, want 503", code, body)
	}
	if code, body := httpGet(t, "http://"+healthz+"/livez"); code != http.StatusOK {
		t.Errorf("/livez = %d %s, want 200", code, body)
	}
	if code, _ := httpGet(t, "http://"+metricsAddr+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --profiling = %d, want 404", code)
	}
	_, text := httpGet(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		`kubeproxy_proxy_healthz_total{code="503"} 2`,
		`kubeproxy_proxy_livez_total{code="200"} 1`,
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{") {
		t.Errorf("a last sync timestamp without a sync")
	}
	if tables.get(knftables.IPv4Family).Table != nil {
		t.Errorf("the table was written without the API server")
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("daemon exited %d after shutdown: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not stop after its context was cancelled")
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("daemon log:\n%s", stderr.String())
	}
}

// ownProcessEnv is set in the environment of a test that inOwnProcess runs.
const ownProcessEnv = "NFTPROXY_TEST_OWN_PROCESS"

// inOwnProcess runs the calling test alone in a child process of the test binary.
// runDaemon sets klog's global logger, which the informers of a daemon that an
// earlier test ran may still read as they stop (a data race under -race): a
// second daemon runs in a process of its own.
func inOwnProcess(t *testing.T) {
	t.Helper()
	args := []string{"-test.run=^" + t.Name() + "$", "-test.count=1"}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), ownProcessEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in its own process: %v\n%s", t.Name(), err, out)
	}
	if testing.Verbose() {
		t.Logf("%s", out)
	}
}

// syncBuffer is a bytes.Buffer safe for the daemon's logger and the test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
