package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/internal/testenv"
)

// repoRoot is the repository, seen from this package's directory.
const repoRoot = "../.."

// binaries are built once for the package's tests (TestMain); why says why they are
// missing.
var (
	binaries Binaries
	why      string
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if why = testenv.Missing("nft", "iptables-restore"); why != "" {
		why = "the cluster lab " + why
		return m.Run()
	}
	var err error
	if binaries, err = FindBinaries(repoRoot); err != nil {
		why = "the cluster lab needs the Kubernetes binaries: " + err.Error()
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "nftproxy-cluster-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	if err := binaries.BuildNftProxy(repoRoot, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("nftproxy built in %v\n", time.Since(start).Round(time.Millisecond))
	return m.Run()
}

// startCluster starts a cluster of spec for t, removed (and checked for leftover
// namespaces) when t ends. It skips t when the machine or the binaries cannot run it.
func startCluster(t *testing.T, ctx context.Context, spec Spec) *Cluster {
	t.Helper()
	if why != "" {
		t.Skip(why)
	}
	start := time.Now()
	c, err := New(ctx, spec, binaries, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster %s up in %v (%d nodes)", c.ID, time.Since(start).Round(time.Millisecond), len(c.Nodes))
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range c.Processes() {
				t.Logf("=== %s (exited: %v), log tail:\n%s", p.Name, p.Exited(), p.Tail(3000))
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
		if leaks, err := lab.LeaksOf([]string{c.ID}); err != nil || len(leaks) > 0 {
			t.Errorf("namespaces left behind: %v %v", leaks, err)
		}
	})
	for _, n := range c.Nodes {
		if p := n.ProxyProcess; p != nil && p.Exited() {
			t.Fatalf("node %s: %s exited:\n%s", n.Spec.Name, n.Spec.Proxy, p.Tail(3000))
		}
	}
	return c
}

// addPods adds the pods of specs to c, by name.
func addPods(t *testing.T, ctx context.Context, c *Cluster, specs ...PodSpec) map[string]*Pod {
	t.Helper()
	pods := map[string]*Pod{}
	for _, ps := range specs {
		p, err := c.AddPod(ctx, ps)
		if err != nil {
			t.Fatal(err)
		}
		pods[ps.Name] = p
	}
	return pods
}

// createService creates a ClusterIP Service of one TCP port, retrying while the API
// server has not made its default ServiceCIDR yet.
func createService(t *testing.T, ctx context.Context, c *Cluster, name string, ip netip.Addr, port, target uint16, selector map[string]string) {
	t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.ServiceSpec{
			ClusterIP: ip.String(),
			Selector:  selector,
			Ports:     []v1.ServicePort{{Name: "echo", Port: int32(port), TargetPort: intstr.FromInt32(int32(target)), Protocol: v1.ProtocolTCP}},
		},
	}
	err := waitFor(ctx, defaultWait, "create service default/"+name, func() (bool, error) {
		_, err := c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// endpointConditions returns the conditions of a Service's endpoints in its
// EndpointSlices, by pod: ready, serving and terminating as R, S and T, "-" for false.
func endpointConditions(ctx context.Context, c *Cluster, service string) (map[string]string, error) {
	list, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx,
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range list.Items {
		if s.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" {
			return nil, fmt.Errorf("slice %s managed by %q", s.Name, s.Labels[discoveryv1.LabelManagedBy])
		}
		for _, ep := range s.Endpoints {
			flag := func(b *bool, c string) string {
				if b != nil && *b {
					return c
				}
				return "-"
			}
			name := ""
			if ep.TargetRef != nil {
				name = ep.TargetRef.Name
			}
			out[name] = flag(ep.Conditions.Ready, "R") + flag(ep.Conditions.Serving, "S") + flag(ep.Conditions.Terminating, "T")
		}
	}
	return out, nil
}

// waitEndpoints waits until the Service's endpoints and conditions are want.
func waitEndpoints(t *testing.T, ctx context.Context, c *Cluster, service string, want map[string]string) {
	t.Helper()
	var got map[string]string
	err := waitFor(ctx, defaultWait, fmt.Sprintf("endpoints of default/%s %v", service, want), func() (bool, error) {
		var err error
		got, err = endpointConditions(ctx, c, service)
		return maps.Equal(got, want), err
	})
	if err != nil {
		t.Fatalf("%v; last seen %v", err, got)
	}
}

// tally is what n connections from a client reached: answers by pod, and failures by
// outcome class.
type tally struct {
	reached  map[string]int
	failures map[lab.Outcome]int
	sources  map[netip.Addr]int // the client addresses the backends saw
}

func (t tally) String() string {
	return fmt.Sprintf("reached %v, failed %v", t.reached, t.failures)
}

// connect makes n TCP connections from p to dst, each given 4s: time for two SYN
// retransmissions. A reject's ICMP error can reach the client while connect() still holds
// the socket, and the kernel then keeps it as a soft error until the next retransmission
// (after 1s, then 3s) draws another.
func connect(p *Pod, dst netip.AddrPort, n int) tally {
	return connectWithin(p, dst, n, 4*time.Second)
}

// connectWithin makes n TCP connections from p to dst, each given timeout.
func connectWithin(p *Pod, dst netip.AddrPort, n int, timeout time.Duration) tally {
	return connectFrom(p.NS, dst, n, timeout)
}

// TestClusterIPAcrossNodes sends real TCP connections to a ClusterIP whose two pods run on
// different nodes, from clients behind nftproxy nodes and kube-proxy nodes (nftables and
// iptables mode), once the real EndpointSlice controller has made the slice.
func TestClusterIPAcrossNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec := DefaultSpec()
	spec.Nodes = append(spec.Nodes, NodeSpec{Name: "node-d", Proxy: KubeProxyIptables})
	c := startCluster(t, ctx, spec)

	const echoPort = 8080
	clusterIP := netip.MustParseAddr("172.30.0.10")
	web := map[string]string{"app": "web"}
	pods := addPods(t, ctx, c,
		PodSpec{Name: "web-b", Node: "node-b", Labels: web, Ports: []uint16{echoPort}},
		PodSpec{Name: "web-c", Node: "node-c", Labels: web, Ports: []uint16{echoPort}},
		PodSpec{Name: "client-a", Node: "node-a"},
		PodSpec{Name: "client-b", Node: "node-b"},
		PodSpec{Name: "client-c", Node: "node-c"},
		PodSpec{Name: "client-d", Node: "node-d"},
	)
	start := time.Now()
	createService(t, ctx, c, "web", clusterIP, 80, echoPort, web)
	waitEndpoints(t, ctx, c, "web", map[string]string{"web-b": "RS-", "web-c": "RS-"})
	t.Logf("EndpointSlice made by the controller %v after the Service", time.Since(start).Round(time.Millisecond))

	const conns = 40
	dst := netip.AddrPortFrom(clusterIP, 80)
	req := lab.Request{Proto: lab.TCP, Dst: dst, Timeout: 2 * time.Second}
	clients := []string{"client-a", "client-b", "client-c", "client-d"}
	// The first answer, to every client at once: each node's proxy has programmed the
	// Service. Measured from the moment the slice was seen.
	sliced := time.Now()
	firsts := make([]time.Duration, len(clients))
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, client := range clients {
		wg.Go(func() {
			errs[i] = waitFor(ctx, defaultWait, client+": first answer from "+dst.String(), func() (bool, error) {
				_, err := pods[client].Echo(req)
				return err == nil, err
			})
			firsts[i] = time.Since(sliced)
		})
	}
	wg.Wait()
	for i, client := range clients {
		p := pods[client]
		node := c.Node(p.Spec.Node)
		if errs[i] != nil {
			t.Errorf("%s on %s (%s): %v", client, node.Spec.Name, node.Spec.Proxy, errs[i])
			continue
		}
		got := connect(p, dst, conns)
		for src := range got.sources {
			if src != p.Addr {
				t.Errorf("%s: a backend saw source %s, want the pod's own %s", client, src, p.Addr)
			}
		}
		t.Logf("%s on %s (%s): first answer %v after the slice; then %d connections to %s: %v",
			client, node.Spec.Name, node.Spec.Proxy, firsts[i].Round(time.Millisecond), conns, dst, got)
		if len(got.failures) > 0 {
			t.Errorf("%s: connections failed: %v", client, got.failures)
		}
		reached := got.reached
		if reached["web-b"] == 0 || reached["web-c"] == 0 {
			t.Errorf("%s reached %v, want both web-b and web-c", client, reached)
		}
	}
}
