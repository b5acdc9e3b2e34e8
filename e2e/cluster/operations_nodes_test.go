package cluster

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// TestOperationsProxyKilled kills the proxy of one node at a time (nftproxy, then
// kube-proxy) by its PID, with clients connected throughout, among them one through a load
// balancer that sends a LoadBalancer Service's traffic (externalTrafficPolicy Local) only
// to nodes whose health-check node port answers 200: the other nodes keep serving, the
// load balancer steers away from the node while its proxy is dead and back once it runs
// again, and no connection fails (the dead proxy's rules stay in place).
func TestOperationsProxyKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, DefaultSpec())
	pods := opsPods(t, ctx, c)
	svc := createOpsService(t, ctx, c, v1.ServiceTypeLoadBalancer, v1.ServiceExternalTrafficPolicyLocal, pods)
	vip := netip.AddrPortFrom(netip.MustParseAddr("192.168.80.5"), 80)
	lb, err := c.StartLoadBalancer(vip, uint16(svc.Spec.Ports[0].NodePort), uint16(svc.Spec.HealthCheckNodePort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Stop)
	all := []string{"node-a", "node-b", "node-c"}
	waitHealthy(t, ctx, lb, all)
	traffic := opsClients(t, ctx, c, pods, svc)
	waitAnswer(t, ctx, c.External, "via-lb", vip)
	viaLB, err := StartTraffic(TrafficSpec{Name: "via-lb", From: c.External, Targets: []netip.AddrPort{vip}})
	if err != nil {
		t.Fatal(err)
	}
	traffic["via-lb"] = viaLB
	t.Cleanup(func() { viaLB.Stop() })
	time.Sleep(time.Second)

	for _, victim := range []string{"node-a", "node-b"} { // nftproxy, kube-proxy
		n := c.Node(victim)
		proxy := n.Spec.Proxy
		killed := time.Now()
		if err := c.KillProxy(ctx, n); err != nil {
			t.Fatal(err)
		}
		waitHealthy(t, ctx, lb, slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == victim }))
		detected := time.Since(killed)
		before := lb.Picks()
		time.Sleep(3 * time.Second)
		after := lb.Picks()
		t.Logf("%s (%s) killed: the load balancer saw it unhealthy after %v; picks in the next 3s: %v",
			victim, proxy, detected.Round(time.Millisecond), diffPicks(before, after))
		if after[victim] != before[victim] {
			t.Errorf("%s (%s) dead: the load balancer still sent it %d connections", victim, proxy, after[victim]-before[victim])
		}
		for _, other := range all {
			if other != victim && after[other] == before[other] {
				t.Errorf("%s (%s) dead: the load balancer sent nothing to %s", victim, proxy, other)
			}
		}
		start := time.Now()
		if err := c.StartProxy(ctx, n, proxy); err != nil {
			t.Fatal(err)
		}
		waitSynced(t, ctx, c, n, start)
		waitHealthy(t, ctx, lb, all)
		before = lb.Picks()
		time.Sleep(2 * time.Second)
		after = lb.Picks()
		t.Logf("%s (%s) started again: picks in the next 2s: %v", victim, proxy, diffPicks(before, after))
		if after[victim] == before[victim] {
			t.Errorf("%s (%s) running again: the load balancer sends it nothing", victim, proxy)
		}
	}
	t.Logf("load balancer's health changes: %v", lb.Events())
	counts := stopClients(t, traffic)
	failed, attempts := failures(counts)
	t.Logf("proxies killed: %d failed of %d new connections (%d through the load balancer), held connections broken: %d",
		failed, attempts, counts["via-lb"].Attempts, heldBroken(counts))
	if failed > 0 {
		t.Errorf("proxies killed: want 0 failures, got %d", failed)
	}
}

// waitHealthy waits until the load balancer finds exactly the nodes want healthy.
func waitHealthy(t *testing.T, ctx context.Context, lb *LoadBalancer, want []string) {
	t.Helper()
	err := waitFor(ctx, defaultWait, "load balancer: healthy nodes "+strings.Join(want, ","), func() (bool, error) {
		return slices.Equal(lb.Healthy(), want), nil
	})
	if err != nil {
		t.Fatalf("%v; healthy %v", err, lb.Healthy())
	}
}

// diffPicks returns after-before per node.
func diffPicks(before, after map[string]int) map[string]int {
	out := maps.Clone(after)
	for n, v := range before {
		out[n] -= v
	}
	return out
}

// TestOperationsNodeJoins adds a node with no rules to a running cluster and a client pod
// on it: while no proxy runs there, no ClusterIP answers from the node or its pod (the
// `kubernetes` Service's neither); nftproxy, configured as deploy/ does, reaches the API
// server by its own address, converges, and then the node's pod reaches the Services
// with no failed connection.
func TestOperationsNodeJoins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, DefaultSpec())
	pods := opsPods(t, ctx, c)
	createOpsService(t, ctx, c, v1.ServiceTypeClusterIP, "", pods)
	kube, err := c.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	apiService := netip.AddrPortFrom(netip.MustParseAddr(kube.Spec.ClusterIP), 443)
	web := netip.AddrPortFrom(netip.MustParseAddr(opsClusterIP), 80)

	n, err := c.AddNode(ctx, NodeSpec{Name: "node-d", Proxy: NoProxy})
	if err != nil {
		t.Fatal(err)
	}
	client, err := c.AddPod(ctx, PodSpec{Name: "client-node-d", Node: "node-d"})
	if err != nil {
		t.Fatal(err)
	}
	if tables, err := c.Tables(ctx, n); err != nil || len(tables) > 0 {
		t.Fatalf("node-d: tables %v (%v), want none", tables, err)
	}
	for _, ns := range []*lab.NS{n.NS, client.NS} {
		for _, dst := range []netip.AddrPort{apiService, web} {
			if err := dial(ns, dst); err == nil {
				t.Errorf("%s: %s answers before any proxy runs on node-d", ns, dst)
			} else {
				t.Logf("before nftproxy: %s to %s: %s", ns, dst, failClass(err))
			}
		}
	}

	start := time.Now()
	if err := c.StartProxy(ctx, n, NftProxy); err != nil {
		t.Fatal(err)
	}
	server := kubeconfigServer(t, filepath.Join(c.Dir, "node-d", "kubeconfig.conf"))
	if !server.IsValid() || c.Spec.ServiceCIDR.Contains(server) {
		t.Errorf("nftproxy's kubeconfig names the API server %v, want an address outside the service CIDR %s", server, c.Spec.ServiceCIDR)
	}
	synced := waitSynced(t, ctx, c, n, start)
	waitAnswer(t, ctx, client.NS, "client-node-d", web)
	answered := time.Since(start)
	// From the node itself, as a hostNetwork pod would: the control plane routes no pod
	// CIDR back (it runs no CNI in the lab).
	if err := dial(n.NS, apiService); err != nil {
		t.Errorf("node-d: the kubernetes Service %s: %v", apiService, err)
	}
	tr, err := StartTraffic(TrafficSpec{Name: "client-node-d", From: client.NS, Targets: []netip.AddrPort{web},
		Held: []netip.AddrPort{netip.AddrPortFrom(web.Addr(), 90)}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	got := tr.Stop()
	t.Logf("node-d joined: nftproxy (API server %s) synced %v after its start, its pod answered %v after, the kubernetes Service answers the node; then %v",
		server, synced.Round(time.Millisecond), answered.Round(time.Millisecond), got)
	if got.Failures() > 0 || got.Answered == 0 {
		t.Errorf("client-node-d after nftproxy converged: %v", got)
	}
}

// dial opens (and closes) a TCP connection from ns to dst, given a second.
func dial(ns *lab.NS, dst netip.AddrPort) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// kubeconfigServer returns the address of the API server a kubeconfig's clusters name
// (the zero Addr when one is not an IP address).
func kubeconfigServer(t *testing.T, path string) netip.Addr {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var addr netip.Addr
	for name, cl := range kc.Clusters {
		u, err := url.Parse(cl.Server)
		if err != nil {
			t.Fatalf("%s: cluster %s: server %q: %v", path, name, cl.Server, err)
		}
		if addr, err = netip.ParseAddr(u.Hostname()); err != nil {
			return netip.Addr{}
		}
	}
	return addr
}
