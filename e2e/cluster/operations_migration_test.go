package cluster

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// The migration of deploy/README.md ("Replacing kube-proxy on a running cluster, node by
// node"), as the lab models it: the lab has no kubelet and no DaemonSet controller, so the
// test does what they would do when a node's label changes, in the order they do it.

// migrationLabel is the node label that chooses nftproxy (deploy/README.md).
const migrationLabel = "nftproxy.io/proxy"

// moveToNftProxy is deploy/README.md's steps 3 and 4 for node n: label it; the DaemonSet
// controller deletes kube-proxy's pod (the kubelet stops it: SIGTERM; its rules stay) and
// creates nftproxy's: the init container's --init-only, then the daemon with
// --cleanup-table-after-sync=kube-proxy and --cleanup-kube-proxy-iptables, which delete
// kube-proxy's tables and iptables-mode chains once its own rules serve. Then check that
// nftproxy synced and that the node holds nftproxy's tables, no kube-proxy table and no
// chain of kube-proxy's iptables mode, the kubelet's KUBE-FIREWALL (which kube-proxy
// also makes) kept.
func moveToNftProxy(t *testing.T, ctx context.Context, c *Cluster, n *Node) {
	t.Helper()
	from := n.Spec.Proxy
	if err := c.LabelNode(ctx, n.Spec.Name, migrationLabel, "nftproxy"); err != nil {
		t.Fatal(err)
	}
	if err := c.TerminateProxy(n); err != nil {
		t.Fatal(err)
	}
	if out, err := c.NftProxyInitOnly(ctx, n); err != nil {
		t.Fatalf("%s: init container: %v %s", n.Spec.Name, err, out)
	}
	start := time.Now()
	before, firewall := 0, 0
	if from == KubeProxyIptables {
		before, firewall = kubeChains(t, ctx, n)
	}
	if err := c.StartProxy(ctx, n, NftProxy); err != nil { // with the DaemonSet's takeover flags
		t.Fatal(err)
	}
	took := waitSynced(t, ctx, c, n, start)
	var tables []string
	err := waitFor(ctx, 10*time.Second, n.Spec.Name+": kube-proxy's tables deleted", func() (bool, error) {
		var err error
		tables, err = c.Tables(ctx, n)
		return !slices.Contains(tables, "ip kube-proxy") && !slices.Contains(tables, "ip6 kube-proxy"), err
	})
	if err != nil || !slices.Contains(tables, "ip nftproxy") {
		t.Errorf("%s: tables %v: want ip nftproxy and no kube-proxy table (%v)", n.Spec.Name, tables, err)
	}
	if from == KubeProxyIptables {
		left, kept := 0, 0
		err := waitFor(ctx, 10*time.Second, n.Spec.Name+": kube-proxy's iptables chains removed", func() (bool, error) {
			left, kept = kubeChains(t, ctx, n)
			return left == 0, nil
		})
		if err != nil || before == 0 || firewall == 0 || kept != firewall {
			t.Errorf("%s: %d of %d lines of kube-proxy's KUBE- chains or jumps left; KUBE-FIREWALL's %d of %d (%v)",
				n.Spec.Name, left, before, kept, firewall, err)
		}
		t.Logf("%s: nftproxy removed kube-proxy's iptables chains (%d lines of iptables-save and ip6tables-save), kept KUBE-FIREWALL's %d",
			n.Spec.Name, before, kept)
	}
	t.Logf("%s: moved from %s to nftproxy, synced %v after its start; tables %v", n.Spec.Name, from, took.Round(time.Millisecond), tables)
}

// kubeChains counts the lines of iptables-save and ip6tables-save that name one of
// kube-proxy's KUBE- chains, and apart those naming KUBE-FIREWALL, which kube-proxy
// makes and its cleanup leaves (it is the kubelet's too: it drops connections to
// 127.0.0.0/8 from outside).
func kubeChains(t *testing.T, ctx context.Context, n *Node) (kube, firewall int) {
	t.Helper()
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		out, err := n.Exec(ctx, "", save)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(out, "\n") {
			switch {
			case strings.Contains(strings.ReplaceAll(l, "KUBE-FIREWALL", ""), "KUBE-"):
				kube++
			case strings.Contains(l, "KUBE-FIREWALL"):
				firewall++
			}
		}
	}
	return kube, firewall
}

// moveToKubeProxy is deploy/README.md's "Roll a node back": remove the label (nftproxy's
// pod stops, leaving its table; kube-proxy's starts), wait for kube-proxy's first sync,
// then `nftproxy --cleanup` on the node.
func moveToKubeProxy(t *testing.T, ctx context.Context, c *Cluster, n *Node, to Proxy) {
	t.Helper()
	if err := c.LabelNode(ctx, n.Spec.Name, migrationLabel, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.TerminateProxy(n); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.StartProxy(ctx, n, to); err != nil {
		t.Fatal(err)
	}
	took := waitSynced(t, ctx, c, n, start)
	if out, err := c.NftProxyOnce(ctx, n, "--cleanup"); err != nil {
		t.Fatalf("%s: nftproxy --cleanup: %v %s", n.Spec.Name, err, out)
	}
	want := "ip kube-proxy"
	if to == KubeProxyIptables {
		want = "ip nat" // iptables-nft's
		if kube, _ := kubeChains(t, ctx, n); kube == 0 {
			t.Errorf("%s: no KUBE- chain after kube-proxy's sync", n.Spec.Name)
		}
	}
	tables := checkTables(t, ctx, c, n, want, "ip nftproxy")
	t.Logf("%s: back on %s, synced %v after its start; tables %v", n.Spec.Name, to, took.Round(time.Millisecond), tables)
}

// checkTables fails t unless the node holds the table want and not the table gone.
func checkTables(t *testing.T, ctx context.Context, c *Cluster, n *Node, want, gone string) []string {
	t.Helper()
	tables, err := c.Tables(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(tables, want) || slices.Contains(tables, gone) {
		t.Errorf("%s: tables %v: want %q and no %q", n.Spec.Name, tables, want, gone)
	}
	return tables
}

// TestOperationsMigration moves every node of a cluster running kube-proxy (three in
// nftables mode, one in iptables mode) to nftproxy, one at a time as deploy/README.md says,
// and back again, with clients in pods on every node and outside (through every node's
// node ports) connected throughout: no new connection fails and every long-lived
// connection survives.
func TestOperationsMigration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Spec{Nodes: []NodeSpec{
		{Name: "node-a", Proxy: KubeProxyNftables},
		{Name: "node-b", Proxy: KubeProxyNftables},
		{Name: "node-c", Proxy: KubeProxyNftables},
		{Name: "node-d", Proxy: KubeProxyIptables},
	}})
	pods := opsPods(t, ctx, c)
	svc := createOpsService(t, ctx, c, v1.ServiceTypeNodePort, v1.ServiceExternalTrafficPolicyCluster, pods)
	traffic := opsClients(t, ctx, c, pods, svc)
	time.Sleep(time.Second)

	step := func(what string, n *Node, move func()) {
		before, _ := snapshot(traffic)
		move()
		time.Sleep(time.Second) // connections through the node's new rules
		after, attempts := snapshot(traffic)
		t.Logf("%s %s: %d failures (so far %d in %d new connections)", what, n.Spec.Name, after-before, after, attempts)
	}
	was := map[*Node]Proxy{}
	for _, n := range c.Nodes {
		was[n] = n.Spec.Proxy
		step("to nftproxy:", n, func() { moveToNftProxy(t, ctx, c, n) })
	}
	for _, n := range c.Nodes {
		step("back to "+string(was[n])+":", n, func() { moveToKubeProxy(t, ctx, c, n, was[n]) })
	}
	counts := stopClients(t, traffic)
	failed, attempts := failures(counts)
	t.Logf("migration of %d nodes to nftproxy and back: %d failed of %d new connections, held connections broken: %d",
		len(c.Nodes), failed, attempts, heldBroken(counts))
	if failed > 0 {
		t.Errorf("migration: want 0 failures, got %d", failed)
	}
}
