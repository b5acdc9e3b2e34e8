package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// TestOperationsScaleUnderLoad replaces a Service's backends twice under load, as a
// rolling update does: new pods come up (ready), the old ones are deleted with a grace
// period (terminating, still serving, until the kubelet removes them), with clients behind
// two nftproxy nodes and a kube-proxy node connecting throughout. It counts each client's
// failed connections: nftproxy's clients fail no more than kube-proxy's.
func TestOperationsScaleUnderLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, DefaultSpec())
	pods := opsPods(t, ctx, c)
	createOpsService(t, ctx, c, v1.ServiceTypeClusterIP, "", pods)
	web := netip.AddrPortFrom(netip.MustParseAddr(opsClusterIP), 80)
	traffic := map[string]*Traffic{}
	for _, n := range c.Nodes {
		name := "client-" + n.Spec.Name
		waitAnswer(t, ctx, pods[name].NS, name, web)
		tr, err := StartTraffic(TrafficSpec{Name: name, From: pods[name].NS, Targets: []netip.AddrPort{web}})
		if err != nil {
			t.Fatal(err)
		}
		traffic[name] = tr
		t.Cleanup(func() { tr.Stop() })
	}
	time.Sleep(time.Second)

	backends := map[string]*Pod{}
	for _, n := range c.Nodes {
		backends["web-"+n.Spec.Name] = pods["web-"+n.Spec.Name]
	}
	for round := 1; round <= 2; round++ {
		backends = replaceBackends(t, ctx, c, backends, round)
		failed, attempts := snapshot(traffic)
		t.Logf("round %d: backends %v; so far %d failures in %d new connections", round, keys(backends), failed, attempts)
	}

	graceful := map[string]int{}
	for name, tr := range traffic {
		graceful[name] = tr.Snapshot().Failures()
	}
	abrupt := abruptRemoval(t, ctx, c, traffic, backends)
	counts := stopClients(t, traffic)
	_, attempts := failures(counts)

	kubeProxy, nftProxy := 0, 0
	for _, n := range c.Nodes {
		f := graceful["client-"+n.Spec.Name]
		switch n.Spec.Proxy {
		case NftProxy:
			nftProxy = max(nftProxy, f)
		case KubeProxyNftables:
			kubeProxy = f
		}
	}
	t.Logf("backends replaced twice with terminating pods, under load (%d new connections in all): failures of the worst client behind nftproxy %d, behind kube-proxy %d; "+
		"then a backend removed without a terminating phase (as on a crash): failures by client %v", attempts, nftProxy, kubeProxy, abrupt)
	if nftProxy > kubeProxy {
		t.Errorf("a client behind nftproxy had %d failed connections, the one behind kube-proxy %d", nftProxy, kubeProxy)
	}
}

// replaceBackends adds one new backend per node, waits until the controller has them
// ready, deletes the old ones with a grace period, waits until they are terminating (and
// every proxy has synced since, and had a few syncs' time, to stop choosing them), then
// removes them. It returns the new backends.
func replaceBackends(t *testing.T, ctx context.Context, c *Cluster, old map[string]*Pod, round int) map[string]*Pod {
	t.Helper()
	want := map[string]string{}
	for name := range old {
		want[name] = "RS-"
	}
	fresh := map[string]*Pod{}
	for _, n := range c.Nodes {
		name := fmt.Sprintf("web-%s-%d", n.Spec.Name, round)
		p, err := c.AddPod(ctx, PodSpec{Name: name, Node: n.Spec.Name, Labels: opsLabels, Ports: []uint16{opsEchoPort}})
		if err != nil {
			t.Fatal(err)
		}
		fresh[name], want[name] = p, "RS-"
	}
	waitEndpoints(t, ctx, c, "web", want)
	time.Sleep(time.Second)
	// The proxies' syncs that follow the deletions are after this (waitEndpoints polls,
	// so a proxy may sync before it returns; and kube-proxy syncs only on changes).
	deleted := time.Now()
	for name, p := range old {
		if err := c.Terminate(ctx, p, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		want[name] = "-ST"
	}
	waitEndpoints(t, ctx, c, "web", want)
	time.Sleep(2 * time.Second) // the grace period: terminating pods still serve
	for _, n := range c.Nodes { // every proxy synced since: a slow machine slows both alike
		waitSynced(t, ctx, c, n, deleted)
	}
	for name, p := range old {
		if err := c.Remove(ctx, p); err != nil {
			t.Fatal(err)
		}
		delete(want, name)
	}
	waitEndpoints(t, ctx, c, "web", want)
	time.Sleep(time.Second)
	return fresh
}

// abruptRemoval removes one backend at once, without a terminating phase, as when a pod
// crashes: the proxies route to it until the controller's slice reaches them, so some
// connections fail behind every proxy (logged for comparison, not asserted: they depend on
// timing). It returns each client's failures meanwhile.
func abruptRemoval(t *testing.T, ctx context.Context, c *Cluster, traffic map[string]*Traffic, backends map[string]*Pod) map[string]int {
	t.Helper()
	before := map[string]int{}
	for name, tr := range traffic {
		before[name] = tr.Snapshot().Failures()
	}
	names := keys(backends)
	victim := backends[names[0]]
	want := map[string]string{}
	for _, name := range names[1:] {
		want[name] = "RS-"
	}
	if err := c.Remove(ctx, victim); err != nil {
		t.Fatal(err)
	}
	waitEndpoints(t, ctx, c, "web", want)
	time.Sleep(4 * time.Second) // the connections in flight time out (3s)
	out := map[string]int{}
	for name, tr := range traffic {
		out[name] = tr.Snapshot().Failures() - before[name]
	}
	return out
}

// keys returns the names of m, sorted.
func keys(m map[string]*Pod) []string {
	return slices.Sorted(maps.Keys(m))
}
