package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The peer conformance suite: the real kube-proxy (nftables mode) is the oracle. Random
// sets of Services and pods are created in a cluster whose node-a runs nftproxy and
// node-b kube-proxy; once both have programmed a set, each node's live ruleset is traced
// with the simulator over the same packets, translated to the node, and the outcome
// classes compared. Every difference must be one that docs/kube-proxy-differences.md
// explains (the explanations table below); any other fails the test.
//
// Fairness: every pod of a set that runs on a compared node has a twin on the other one
// (same labels, state and ports, made in the same order so both nodes number them
// alike), and each node is a zone of its own; what is local, in-zone or on-node to one
// node is then exactly the twin of what is to the other, and the canonical names
// "NAME@here" and "NAME@peer" make the outcomes comparable. Remote pods run on a third
// node, the same for both. The cluster is dual-stack: a set's Services are IPv4, IPv6
// or dual-stack, and each destination is probed over every family its Service has.
// Then every feature scenario is replayed the same way, its IPv6 objects and packets
// too (peer_features_test.go); NFTPROXY_PEER_FEATURES=0 leaves them out.

// peerSeedAndSets returns the suite's inputs: NFTPROXY_PEER_SEED and
// NFTPROXY_PEER_SETS override them (CI runs the defaults).
func peerSeedAndSets(t *testing.T) (uint64, int) {
	seed, sets := uint64(20251126), 5
	if v := os.Getenv("NFTPROXY_PEER_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 0, 64)
		if err != nil {
			t.Fatalf("NFTPROXY_PEER_SEED=%q: want an unsigned integer", v)
		}
		seed = s
	}
	if v := os.Getenv("NFTPROXY_PEER_SETS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 30 {
			t.Fatalf("NFTPROXY_PEER_SETS=%q: want 1 to 30 (a node holds 250 pods)", v)
		}
		sets = n
	}
	return seed, sets
}

// peerTally counts what the suite compared.
type peerTally struct {
	scenarios, packets, differences, unexplained int
	// packets6 counts the IPv6 packets among packets.
	packets6 int
	// byReason counts the explained differences by the document's heading.
	byReason map[string]int
	// kinds counts kube-proxy's outcomes by kind (outcomeKinds), and the endpoints the
	// controller hinted: a comparison that never saw one of them compared rulesets that
	// were not programmed, or sets without topology.
	kinds map[string]int
}

func (p peerTally) String() string {
	return fmt.Sprintf("peer conformance: %d scenarios, %d packets compared (%d IPv6), %d differences, %d unexplained",
		p.scenarios, p.packets, p.packets6, p.differences, p.unexplained)
}

// TestPeerConformance compares nftproxy's live ruleset with kube-proxy's over random
// sets and the feature scenarios, and prints the summary line.
func TestPeerConformance(t *testing.T) {
	seed, sets := peerSeedAndSets(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(3+sets)*time.Minute)
	defer cancel()
	spec := Spec{DualStack: true, Nodes: zoned([]NodeSpec{
		{Name: "node-a", Proxy: NftProxy},
		{Name: "node-b", Proxy: KubeProxyNftables},
		{Name: "node-c", Proxy: NoProxy}, // hosts the remote pods
	})}
	c := startCluster(t, ctx, spec)
	a, b, other := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	tally := peerTally{byReason: map[string]int{}, kinds: map[string]int{}}
	t.Cleanup(func() {
		for reason, n := range tally.byReason {
			t.Logf("explained (%s): %d", reason, n)
		}
		t.Logf("coverage (kube-proxy's outcomes, the controller's hints): %v", tally.kinds)
		fmt.Println(tally)
	})
	for i := range sets {
		s := genSet(seed, i, &c.Spec)
		start := time.Now()
		ap, err := applySet(ctx, c, a, b, other, s)
		if err == nil {
			err = ap.waitProgrammed(ctx, c, 3*time.Second, a, b)
		}
		if err != nil {
			t.Fatalf("set %d (seed %d): %v", i, seed, err)
		}
		programmed := time.Since(start)
		zones, nodes, err := ap.hints(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		tally.kinds["endpoints hinted for a zone"] += zones
		tally.kinds["endpoints hinted for a node"] += nodes
		compared, err := comparePeers(ctx, t, c, ap, a, b, &tally)
		if err != nil {
			t.Fatalf("set %d (seed %d): %v", i, seed, err)
		}
		tally.scenarios++
		t.Logf("set %d: %d pods, %d Services, programmed in %v; %d packets compared in %v (unallocated %s)", i,
			2*len(s.twins)+len(s.others), len(s.services), programmed.Round(time.Millisecond), compared,
			(time.Since(start) - programmed).Round(time.Millisecond), s.unallocated)
		if err := removeSet(ctx, c, ap); err != nil {
			t.Fatalf("set %d: remove: %v", i, err)
		}
	}
	if os.Getenv("NFTPROXY_PEER_FEATURES") != "0" {
		replayFeatures(ctx, t, c, a, b, &tally)
	}
	if tally.packets < 10000 && sets >= 5 {
		t.Errorf("%d packets compared, want at least 10000", tally.packets)
	}
	if tally.packets6 == 0 {
		t.Errorf("no IPv6 packet compared")
	}
	for _, kind := range append(outcomeKinds, "endpoints hinted for a zone", "endpoints hinted for a node") {
		if tally.kinds[kind] == 0 && sets >= 5 {
			t.Errorf("none of %q in the sets (kube-proxy's outcomes, the controller's hints): they do not cover it", kind)
		}
	}
}

// count counts one compared packet; report is called for an unexplained difference.
func (p *peerTally) count(pr probe, nftproxy, kubeProxy string, report func()) {
	p.packets++
	if pr.six {
		p.packets6++
	}
	if nftproxy == kubeProxy {
		return
	}
	p.differences++
	if reason := explain(pr, nftproxy, kubeProxy); reason != "" {
		p.byReason[reason]++
		return
	}
	p.unexplained++
	report()
}

// outcomeKinds are words of outcome classes (peerView.branch) the suite must see:
// endpoints reached directly, masqueraded, on this node and not, rejects and drops.
var outcomeKinds = []string{"accept forward to", "masqueraded", "@here", "@peer", "reject", "drop", "accept out"}

// comparePeers traces every probe of the set on both nodes and counts the differences;
// it reports each unexplained one as an error of t.
func comparePeers(ctx context.Context, t *testing.T, c *Cluster, ap *applied, nft, kp *Node, tally *peerTally) (int, error) {
	vn, err := newPeerView(ctx, nft, 0, ap, c)
	if err != nil {
		return 0, err
	}
	vk, err := newPeerView(ctx, kp, 1, ap, c)
	if err != nil {
		return 0, err
	}
	shown := 0
	probes := ap.probes(c.Node(otherNode))
	for _, pr := range probes {
		on, err := vn.outcome(pr)
		if err != nil {
			return 0, fmt.Errorf("%s on %s: %w", pr, nft.Spec.Name, err)
		}
		ok, err := vk.outcome(pr)
		if err != nil {
			return 0, fmt.Errorf("%s on %s: %w", pr, kp.Spec.Name, err)
		}
		for _, kind := range outcomeKinds {
			if strings.Contains(ok, kind) {
				tally.kinds[kind]++
			}
		}
		tally.count(pr, on, ok, func() {
			if shown++; shown <= 40 {
				t.Errorf("unexplained difference: %s\n  nftproxy   (%s): %s\n  kube-proxy (%s): %s",
					pr, vn.packet(pr, 40000), on, vk.packet(pr, 40000), ok)
			}
		})
	}
	if shown > 0 {
		// The rulesets, for nftrace --ruleset FILE: the test's directory goes with it.
		dir := os.Getenv("NFTPROXY_PEER_KEEP")
		if dir == "" {
			dir = t.TempDir()
		}
		for _, v := range []*peerView{vn, vk} {
			path := filepath.Join(dir, fmt.Sprintf("set%d-%s.nft", ap.set.index, v.node.Spec.Name))
			if err := os.WriteFile(path, []byte(v.text), 0o644); err != nil {
				return 0, err
			}
			t.Logf("%s's ruleset: %s", v.node.Spec.Name, path)
		}
	}
	return len(probes), nil
}
