package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/packet"
)

// The feature scenarios' packets sent for real: the replay of peer_features_test.go
// (Services and selector-less EndpointSlices through the API, the scenario's node
// translated to node-a running nftproxy and node-b running kube-proxy in nftables mode),
// with every endpoint made a real echo server at its translated address and every
// packet sent as real connections from the translated client — a pod behind the compared
// node, a pod on node-c, the node itself, or the external namespace with the packet's
// own source address — through each compared node in turn. The outcome class of a
// packet on a node is the set of what its connections got: the endpoint that answered
// and the source it saw (the client's own, or whose), refused, or timed out.

// realConns is the number of connections per packet and node; a packet whose classes
// differ is sent realRetry times as often again on both nodes before they are compared,
// so that an endpoint missed by chance is not a difference; should they still differ, up
// to realRounds-1 times more from scratch, so that a connection lost once on a loaded
// machine (a lone timeout among answers) is not one either: a difference of the
// proxies recurs every time.
const (
	realConns   = 8
	realRetry   = 4
	realRounds  = 3
	realTimeout = 3 * time.Second
	realWorkers = 24
)

// realTally counts what the real replay sent and compared.
type realTally struct {
	scenarios, packets, conns, differences, unexplained int
	// packets6 counts the IPv6 packets among packets.
	packets6 int
	// notSendable counts the packets that cannot be sent for real, by why; failed
	// counts the scenarios the API refused.
	notSendable map[string]int
	failed      int
	// kinds counts kube-proxy's outcome classes by realKinds: a run that never saw one
	// compared a lab where that outcome cannot happen.
	kinds map[string]int
}

// realKinds are words of outcome classes the full run must see on kube-proxy's node:
// answers seen from the client's own address and masqueraded, refusals and timeouts.
var realKinds = []string{"seeing the client", "seeing this node", "@here", "@node-c", string(lab.Refused), string(lab.TimedOut)}

func (r realTally) String() string {
	var why []string
	for _, k := range slices.Sorted(maps.Keys(r.notSendable)) {
		why = append(why, fmt.Sprintf("%d %s", r.notSendable[k], k))
	}
	skipped := 0
	for _, n := range r.notSendable {
		skipped += n
	}
	return fmt.Sprintf("peer real traffic: %d scenarios, %d packets sent (%d IPv6), %d differences, %d unexplained "+
		"(%d scenarios/%d packets not sendable: %s)", r.scenarios, r.packets, r.packets6, r.differences, r.unexplained,
		r.failed, skipped, strings.Join(why, ", "))
}

// realSend is one scenario packet sent on both compared nodes.
type realSend struct {
	r       *replay
	st      *features.Step
	p       [2]packet.Packet
	cl      [2]realClient
	classes [2]map[string]bool
}

// TestPeerRealTraffic sends the feature scenarios' packets for real through nftproxy
// and kube-proxy and compares the outcome classes; it prints the summary line.
// NFTPROXY_PEER_REAL=PATTERN replays only the scenarios whose file matches it, and
// NFTPROXY_PEER_REAL_PHASES=N only their first N phases.
func TestPeerRealTraffic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Spec{DualStack: true, Nodes: zoned([]NodeSpec{
		{Name: "node-a", Proxy: NftProxy},
		{Name: "node-b", Proxy: KubeProxyNftables},
		{Name: "node-c", Proxy: NoProxy},
	})})
	// The kernel rate-limits the unreachables a reject sends to one client: a burst of
	// connections to a Service without endpoints would time out instead of being refused.
	for _, n := range c.Nodes[:2] {
		if err := n.SetSysctl("net.ipv4.icmp_ratelimit", "0"); err != nil {
			t.Fatal(err)
		}
	}
	w := newRealWorld(c)
	t.Cleanup(func() {
		if err := w.stop(); err != nil {
			t.Errorf("echo servers: %v", err)
		}
	})
	tally := realTally{notSendable: map[string]int{}, kinds: map[string]int{}}
	defer func() { fmt.Println(tally) }()
	rs, phases := realReplays(t, c, &tally)
	for k := range phases {
		start := time.Now()
		sends := realPhase(ctx, t, c, w, rs, k, &tally)
		programmed := time.Since(start)
		for side, n := range []*Node{c.Nodes[0], c.Nodes[1]} {
			if err := w.send(sends, side, n, realConns); err != nil {
				t.Fatalf("phase %d: %v", k, err)
			}
		}
		realCompare(t, c, w, sends, &tally)
		t.Logf("phase %d: %d packets, programmed in %v, sent and compared in %v", k, len(sends),
			programmed.Round(time.Millisecond), (time.Since(start) - programmed).Round(time.Millisecond))
	}
	for _, r := range rs {
		if r.failed == nil {
			tally.scenarios++
		} else {
			tally.failed++
		}
	}
	t.Logf("%d connections made; kube-proxy's outcomes: %v", tally.conns, tally.kinds)
	for _, kind := range realKinds {
		if tally.kinds[kind] == 0 && os.Getenv("NFTPROXY_PEER_REAL") == "" {
			t.Errorf("no packet's outcome on kube-proxy's node has %q: the run does not cover it", kind)
		}
	}
}

// realReplays returns the replays of the scenarios NFTPROXY_PEER_REAL picks (all by
// default) and how many of their phases to run (all by default), counting the packets
// left out.
func realReplays(t *testing.T, c *Cluster, tally *realTally) ([]*replay, int) {
	scs, err := features.LoadDir(filepath.Join(repoRoot, "features"))
	if err != nil {
		t.Fatal(err)
	}
	if pat := os.Getenv("NFTPROXY_PEER_REAL"); pat != "" {
		re, err := regexp.Compile(pat)
		if err != nil {
			t.Fatalf("NFTPROXY_PEER_REAL=%q: %v", pat, err)
		}
		scs = slices.DeleteFunc(scs, func(sc *features.Scenario) bool { return !re.MatchString(sc.File) })
	}
	rs, phases := newReplays(c, scs)
	for _, sc := range scs {
		for _, st := range sc.Steps {
			if st.Packet != nil && st.Packet.Family() != packet.IPv4 && !c.Spec.DualStack {
				tally.notSendable["IPv6 (the lab is IPv4 only)"]++
			}
		}
	}
	// NFTPROXY_PEER_REAL_PHASES=N sends only the first N phases' packets.
	if v := os.Getenv("NFTPROXY_PEER_REAL_PHASES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("NFTPROXY_PEER_REAL_PHASES=%q: want a number of phases, 1 or more", v)
		}
		for _, r := range rs {
			for _, ph := range r.phases[min(n, len(r.phases)):] {
				tally.notSendable["in phases left out"] += len(ph.packets)
			}
		}
		phases = min(phases, n)
	}
	return rs, phases
}

// realPhase applies phase k of every replay, waits for both rulesets, makes the
// endpoints real and returns the phase's packets with their clients on both nodes.
func realPhase(ctx context.Context, t *testing.T, c *Cluster, w *realWorld, rs []*replay, k int, tally *realTally) []*realSend {
	a, b := c.Nodes[0], c.Nodes[1]
	if err := applyPhase(ctx, t, c, rs, k, a, b); err != nil {
		t.Fatalf("phase %d: %v", k, err)
	}
	if err := w.syncEndpoints(ctx); err != nil {
		t.Fatalf("phase %d: %v", k, err)
	}
	var sends []*realSend
	for _, r := range rs {
		if k >= len(r.phases) {
			continue
		}
		for _, st := range r.phases[k].packets {
			if r.failed != nil {
				tally.notSendable["of scenarios the API refused"]++
				continue
			}
			s := &realSend{r: r, st: st}
			why := ""
			for side, n := range []*Node{a, b} {
				s.p[side] = r.tr.packet(st, side, n)
				var err error
				if s.cl[side], why, err = w.client(st.From, s.p[side], n); err != nil {
					t.Fatalf("%s line %d: %v", r.sc.File, st.Line, err)
				}
			}
			if why != "" {
				tally.notSendable[why]++
				continue
			}
			sends = append(sends, s)
		}
	}
	return sends
}

// send routes the clients off the compared nodes through n, then makes conns
// connections of every packet from its client on side, realWorkers packets at a time.
func (w *realWorld) send(sends []*realSend, side int, n *Node, conns int) error {
	if err := w.routeVia(n); err != nil {
		return err
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, realWorkers)
	for _, s := range sends {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			got := w.connect(s, side, conns)
			if s.classes[side] == nil {
				s.classes[side] = map[string]bool{}
			}
			maps.Copy(s.classes[side], got)
		}()
	}
	wg.Wait()
	return nil
}

// connect makes conns concurrent connections of s on side and returns their outcomes.
func (w *realWorld) connect(s *realSend, side, conns int) map[string]bool {
	// The first connection alone: with ClientIP affinity, those at once with it would
	// race it to the affinity set. After a refusal the others follow one by one: the
	// kernel's global limit on the unreachables a node sends (a burst of 50) would turn
	// a burst of refusals into timeouts.
	first := w.exchange(s, side)
	got := map[string]bool{first: true}
	if first == string(lab.Refused) {
		for range conns - 1 {
			got[w.exchange(s, side)] = true
		}
		return got
	}
	out := make(chan string, conns)
	for range conns - 1 {
		go func() { out <- w.exchange(s, side) }()
	}
	for range conns - 1 {
		got[<-out] = true
	}
	return got
}

// exchange makes one connection of s on side and returns its outcome.
func (w *realWorld) exchange(s *realSend, side int) string {
	p, cl := s.p[side], s.cl[side]
	var r lab.Reply
	var err error
	// A source port taken on the client (by a listener of the node, say) fails the
	// exchange before any packet: another port then.
	for range 3 {
		r, err = cl.ns.Echo(lab.Request{Proto: lab.Proto(p.Protocol.String()), Dst: p.Dst,
			Src: netip.AddrPortFrom(cl.src, w.sourcePort()), Timeout: realTimeout})
		if lab.Classify(err) != lab.Failed {
			break
		}
	}
	if err != nil {
		return string(lab.Classify(err))
	}
	seen := "the client"
	if a := r.Source.Addr(); a != r.Local.Addr() {
		// Masquerade picks the address of the way out: the pods' gateway towards a pod
		// of the node, the node's own towards another node.
		n := w.c.Nodes[side]
		if seen = w.name(a, side); a == n.PodCIDR.Addr().Next() || n.PodCIDR6.IsValid() && a == n.PodCIDR6.Addr().Next() {
			seen = "this node"
		}
	}
	by, _ := netip.ParseAddr(r.Pod)
	return fmt.Sprintf("answered by %s seeing %s", w.name(by, side), seen)
}

// sourcePort returns a client source port no connection of the run has used yet
// (below the node ports and the kernel's ephemeral range): a UDP exchange from a port
// an earlier one used finds that one's conntrack entry, which is not a new connection
// to reject.
func (w *realWorld) sourcePort() uint16 {
	return uint16(10000 + w.ports.Add(1)%20000)
}

// name is the canonical name of an address seen from the compared node of side: a pod
// on it is "pod .H@here", its twin on the other compared node "pod .H@peer".
func (w *realWorld) name(a netip.Addr, side int) string {
	host := fmt.Sprintf("%s.%d", family(a), a.As16()[15])
	for _, n := range w.c.Nodes {
		switch {
		case (n.Addr == a || n.Addr6 == a) && n.Spec.Name == comparedNodes[side]:
			return "this node"
		case n.Addr == a || n.Addr6 == a:
			return "node " + n.Spec.Name
		case !n.PodCIDR.Contains(a) && !n.PodCIDR6.Contains(a):
		case n.Spec.Name == comparedNodes[side]:
			return "pod " + host + "@here"
		case n.Spec.Name == comparedNodes[1-side]:
			return "pod " + host + "@peer"
		default:
			return "pod " + host + "@" + n.Spec.Name
		}
	}
	return a.String()
}

// podName matches a pod's canonical name.
var podName = regexp.MustCompile(`pod (v6)?\.\d+@[a-z-]+`)

// class is the outcome class of s on side: its outcomes, sorted. Where the scenario has
// ClientIP affinity, which endpoint a client sticks to is chance: its pods are not told
// apart.
func (s *realSend) class(side int) string {
	out := slices.Sorted(maps.Keys(s.classes[side]))
	for _, svc := range s.r.live {
		if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
			for i := range out {
				out[i] = podName.ReplaceAllString(out[i], "a pod")
			}
			out = slices.Compact(out)
			break
		}
	}
	return strings.Join(out, " | ")
}

// realCompare sends the packets whose classes differ again on both nodes, then counts
// the differences and fails on the unexplained ones.
func realCompare(t *testing.T, c *Cluster, w *realWorld, sends []*realSend, tally *realTally) {
	tally.conns += 2 * len(sends) * realConns
	again := sends
	for round := range realRounds {
		again = slices.DeleteFunc(slices.Clone(again), func(s *realSend) bool { return s.class(0) == s.class(1) })
		if len(again) == 0 {
			break
		}
		if round > 0 {
			t.Logf("%d packets whose classes differ sent again from scratch (round %d)", len(again), round+1)
			for _, s := range again {
				s.classes = [2]map[string]bool{}
			}
		}
		for side, n := range []*Node{c.Nodes[0], c.Nodes[1]} {
			if err := w.send(again, side, n, realRetry*realConns); err != nil {
				t.Fatal(err)
			}
		}
		tally.conns += 2 * len(again) * realRetry * realConns
	}
	for _, s := range sends {
		tally.packets++
		if s.p[0].Src.Addr().Is6() {
			tally.packets6++
		}
		on, ok := s.class(0), s.class(1)
		for _, kind := range realKinds {
			if strings.Contains(ok, kind) {
				tally.kinds[kind]++
			}
		}
		if on == ok {
			continue
		}
		tally.differences++
		if realRemoteHairpin(s.st.From, w.name(s.p[0].Src.Addr(), 0), on, ok) {
			continue
		}
		tally.unexplained++
		t.Errorf("unexplained difference: %s line %d (%s)\n  nftproxy   (%s): %s\n  kube-proxy (%s): %s",
			s.r.sc.File, s.st.Line, s.st.Name, s.p[0], on, s.p[1], ok)
	}
}

// realRemoteHairpin is docs/kube-proxy-differences.md's "Hairpin connections to an
// endpoint on another node" in real traffic: a pod on node-c sent back to itself by the
// compared node; nftproxy masquerades it, so it is answered, and kube-proxy does not,
// so the pod's answer to itself never matches its connection (refused or timed out).
// Every other outcome is the same.
func realRemoteHairpin(from features.Origin, self, nftproxy, kubeProxy string) bool {
	if from != features.FromRemotePod {
		return false
	}
	mine := "answered by " + self + " seeing "
	var on, ok []string
	hairpin := false
	for _, b := range branches(nftproxy) {
		if strings.HasPrefix(b, mine) && !strings.HasSuffix(b, "the client") {
			hairpin = true
			continue
		}
		on = append(on, b)
	}
	for _, b := range branches(kubeProxy) {
		if b != string(lab.Refused) && b != string(lab.TimedOut) {
			ok = append(ok, b)
		}
	}
	on = slices.DeleteFunc(on, func(b string) bool { return b == string(lab.Refused) || b == string(lab.TimedOut) })
	sort.Strings(on)
	return hairpin && slices.Equal(on, ok)
}

// TestRealRemoteHairpin checks that the explanation accepts the hairpin of a pod on
// node-c answered through nftproxy and refused or timed out through kube-proxy, and
// nothing near it: another source, another endpoint lost, an answer not masqueraded.
func TestRealRemoteHairpin(t *testing.T) {
	self := "pod .61@node-c"
	kp := "answered by pod .62@node-c seeing this node | timeout"
	cases := []struct {
		name     string
		from     features.Origin
		nftproxy string
		want     bool
	}{
		{"hairpin masqueraded", features.FromRemotePod,
			"answered by pod .61@node-c seeing this node | answered by pod .62@node-c seeing this node", true},
		{"from a pod on the node", features.FromPod,
			"answered by pod .61@node-c seeing this node | answered by pod .62@node-c seeing this node", false},
		{"the other endpoint missing", features.FromRemotePod, "answered by pod .61@node-c seeing this node", false},
		{"the hairpin not masqueraded", features.FromRemotePod,
			"answered by pod .61@node-c seeing the client | answered by pod .62@node-c seeing this node", false},
	}
	for _, tc := range cases {
		if got := realRemoteHairpin(tc.from, self, tc.nftproxy, kp); got != tc.want {
			t.Errorf("%s: explained %v, want %v", tc.name, got, tc.want)
		}
	}
}
