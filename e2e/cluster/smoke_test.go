package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
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

// startCluster builds nftproxy and starts a cluster of spec for t, removed (and checked
// for leftover namespaces) when t ends. It skips t when the machine or the binaries
// cannot run it.
func startCluster(t *testing.T, ctx context.Context, spec Spec) *Cluster {
	t.Helper()
	testenv.RequireRoot(t, "nft")
	bin, err := FindBinaries(repoRoot)
	if err != nil {
		t.Skip("the cluster lab needs the Kubernetes binaries: " + err.Error())
	}
	dir := t.TempDir()
	start := time.Now()
	if err := bin.BuildNftProxy(repoRoot, dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("nftproxy built in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	c, err := New(ctx, spec, bin, dir)
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
	pods := map[string]*Pod{}
	for _, ps := range []PodSpec{
		{Name: "web-b", Node: "node-b", Labels: web, Ports: []uint16{echoPort}},
		{Name: "web-c", Node: "node-c", Labels: web, Ports: []uint16{echoPort}},
		{Name: "client-a", Node: "node-a"},
		{Name: "client-b", Node: "node-b"},
		{Name: "client-c", Node: "node-c"},
		{Name: "client-d", Node: "node-d"},
	} {
		p, err := c.AddPod(ctx, ps)
		if err != nil {
			t.Fatal(err)
		}
		pods[ps.Name] = p
	}

	start := time.Now()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: v1.ServiceSpec{
			ClusterIP: clusterIP.String(),
			Selector:  web,
			Ports:     []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(echoPort), Protocol: v1.ProtocolTCP}},
		},
	}
	// The default ServiceCIDR is made by a controller of the API server just after start.
	err := waitFor(ctx, defaultWait, "create service default/web", func() (bool, error) {
		_, err := c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = waitFor(ctx, defaultWait, "EndpointSlice of default/web with 2 ready endpoints", func() (bool, error) {
		list, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx,
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, s := range list.Items {
			if s.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" {
				return false, fmt.Errorf("slice %s managed by %q", s.Name, s.Labels[discoveryv1.LabelManagedBy])
			}
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready++
				}
			}
		}
		return ready == 2, nil
	})
	if err != nil {
		t.Fatal(err)
	}
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
		reached := map[string]int{}
		var failed []error
		for range conns {
			r, err := p.Echo(req)
			if err != nil {
				failed = append(failed, err)
				continue
			}
			reached[r.Pod]++
			if r.Source.Addr() != p.Addr {
				t.Errorf("%s: the backend %s saw source %s, want the pod's own %s", client, r.Pod, r.Source, p.Addr)
			}
		}
		t.Logf("%s on %s (%s): first answer %v after the slice; then %d connections to %s, %d failed, reached %v",
			client, node.Spec.Name, node.Spec.Proxy, firsts[i].Round(time.Millisecond), conns, dst, len(failed), reached)
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d connections failed: %v", client, len(failed), conns, errors.Join(failed...))
		}
		if reached["web-b"] == 0 || reached["web-c"] == 0 {
			t.Errorf("%s reached %v, want both web-b and web-c", client, reached)
		}
	}
}
