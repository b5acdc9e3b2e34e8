package proxy_test

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/vishvananda/netlink"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// exchange is the result of one echo exchange.
type exchange struct {
	reply lab.Reply
	err   error
}

// exchanges runs n echo exchanges of req from the namespace from, at most par at a time,
// and returns their results in order.
func exchanges(from *lab.NS, req lab.Request, n, par int) []exchange {
	out := make([]exchange, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range par {
		wg.Go(func() {
			for i := range next {
				r, err := from.Echo(req)
				out[i] = exchange{reply: r, err: err}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// connectionCount counts the connections (and UDP exchanges) of this suite, for the
// report.
var connectionCount struct {
	sync.Mutex
	n int
}

// countConnections adds n to the suite's connection count.
func countConnections(n int) {
	connectionCount.Lock()
	connectionCount.n += n
	connectionCount.Unlock()
}

// connections returns the suite's connection count so far.
func connections() int {
	connectionCount.Lock()
	defer connectionCount.Unlock()
	return connectionCount.n
}

// answered asserts that every exchange was answered and returns the answering pods' counts.
func answered(what string, xs []exchange) map[string]int {
	GinkgoHelper()
	countConnections(len(xs))
	counts := map[string]int{}
	var failed []string
	for i, x := range xs {
		if x.err != nil {
			failed = append(failed, fmt.Sprintf("#%d: %v", i, x.err))
			continue
		}
		counts[x.reply.Pod]++
	}
	Expect(failed).To(BeEmpty(), "%s: %d of %d exchanges failed", what, len(failed), len(xs))
	return counts
}

// fairShareSigmas is how far from its expected share an endpoint's count may be, in
// standard deviations of the binomial distribution. At 5 sigma a correct proxier fails
// once in about 1.7 million checks, while a missing endpoint (0 of ~100 expected) or a
// doubled one (~200) is far outside.
const fairShareSigmas = 5

// expectSpread asserts that the n exchanges in xs were all answered, only by pods, each
// pod within fairShareSigmas of n/len(pods), and reports the counts.
func expectSpread(what string, xs []exchange, pods []string) map[string]int {
	GinkgoHelper()
	counts := answered(what, xs)
	for pod := range counts {
		Expect(pods).To(ContainElement(pod), "%s: answered by %s, which is no endpoint; counts %v", what, pod, counts)
	}
	n := float64(len(xs))
	p := 1 / float64(len(pods))
	mean, sd := n*p, math.Sqrt(n*p*(1-p))
	lo, hi := int(math.Ceil(mean-fairShareSigmas*sd)), int(math.Floor(mean+fairShareSigmas*sd))
	for _, pod := range pods {
		Expect(counts[pod]).To(BeNumerically(">=", lo), "%s: %s's share (%v) is below the %d-sigma bound [%d, %d]", what, pod, counts, fairShareSigmas, lo, hi)
		Expect(counts[pod]).To(BeNumerically("<=", hi), "%s: %s's share (%v) is above the %d-sigma bound [%d, %d]", what, pod, counts, fairShareSigmas, lo, hi)
	}
	report("%s: %d connections, %s (each within [%d, %d], %d sigma around %.0f)", what, len(xs), formatCounts(counts, pods), lo, hi, fairShareSigmas, mean)
	return counts
}

func formatCounts(counts map[string]int, pods []string) string {
	var parts []string
	for _, pod := range pods {
		parts = append(parts, fmt.Sprintf("%s %d", pod, counts[pod]))
	}
	return strings.Join(parts, ", ")
}

// expectPreserved asserts that every endpoint saw the client's own address. The port is
// not compared: when two of a client's connections to different frontends reuse a source
// port and are DNATed to the same endpoint, conntrack gives the later one a new source
// port so that the replies can be told apart, SNAT or not.
func expectPreserved(what string, xs []exchange) {
	GinkgoHelper()
	for i, x := range xs {
		Expect(x.reply.Source.Addr()).To(Equal(x.reply.Local.Addr()), "%s #%d: the source address must be preserved (saw %v from %v)", what, i, x.reply.Source, x.reply.Local)
	}
}

// expectMasqueraded asserts that every endpoint saw the node's address towards it (see
// masqAddr) instead of the client's own address and port. When the client already had that
// address, only the port can show the masquerade (fully-random, so it changes but for a
// 1 in ~28,000 chance per connection): most such connections must show a new port.
func expectMasqueraded(what string, xs []exchange) {
	GinkgoHelper()
	sameAddr, samePort := 0, 0
	for i, x := range xs {
		v6 := x.reply.Local.Addr().Is6()
		Expect(x.reply.Source.Addr()).To(Equal(masqAddr(x.reply.Pod, v6)),
			"%s #%d: the source must be masqueraded to the node's address towards %s (client %v)", what, i, x.reply.Pod, x.reply.Local)
		if x.reply.Local.Addr() == x.reply.Source.Addr() {
			sameAddr++
			if x.reply.Local.Port() == x.reply.Source.Port() {
				samePort++
			}
		}
	}
	Expect(samePort).To(BeNumerically("<=", sameAddr/10), "%s: %d of %d connections from the masquerade address kept their port", what, samePort, sameAddr)
}

// expectRefused asserts that one exchange is refused, fast: a REJECT.
func expectRefused(from *lab.NS, req lab.Request) {
	GinkgoHelper()
	req.Timeout = 2 * time.Second
	start := time.Now()
	_, err := from.Echo(req)
	took := time.Since(start)
	countConnections(1)
	Expect(err).To(MatchError(lab.ErrRefused), "%s from %s must be refused", req, from)
	Expect(took).To(BeNumerically("<", 500*time.Millisecond), "%s from %s: refused after %v, not at once", req, from, took)
}

// dropTimeout bounds exchanges that are expected to be dropped.
const dropTimeout = 300 * time.Millisecond

// expectDropped asserts that one exchange times out, and that its packets did not leave
// the node into the void (the lab's default route) but were dropped by a rule: the node's
// void0 transmitted nothing meanwhile.
func expectDropped(l *lab.Lab, from *lab.NS, req lab.Request) {
	GinkgoHelper()
	req.Timeout = dropTimeout
	before := voidPackets(l)
	_, err := from.Echo(req)
	countConnections(1)
	Expect(err).To(MatchError(lab.ErrTimeout), "%s from %s must time out", req, from)
	Expect(voidPackets(l)).To(Equal(before), "%s from %s: packets were routed into the void instead of dropped by a rule", req, from)
}

// voidPackets returns how many packets the node sent (or tried to send) to void0, the
// interface its default routes lead to.
func voidPackets(l *lab.Lab) uint64 {
	GinkgoHelper()
	var n uint64
	Expect(l.Node.Do(func() error {
		link, err := netlink.LinkByName("void0")
		if err != nil {
			return err
		}
		st := link.Attrs().Statistics
		n = st.TxPackets + st.TxDropped
		return nil
	})).To(Succeed())
	return n
}

// tcp returns a TCP echo request to dst.
func tcp(dst netip.AddrPort) lab.Request { return lab.Request{Proto: lab.TCP, Dst: dst} }

// bound returns req bound to source address src.
func bound(req lab.Request, src netip.Addr) lab.Request {
	req.Src = netip.AddrPortFrom(src, 0)
	return req
}

// connectionsPerFrontend is the number of connections spread over a frontend's endpoints.
const connectionsPerFrontend = 300

var _ = Describe("Connections to every Service type", Label("kernel"), func() {
	var l *lab.Lab
	BeforeEach(func(ctx SpecContext) {
		l = newLab(topology())
		startProxy(ctx, l)
	})

	for _, v6 := range []bool{false, true} {
		family := map[bool]string{false: "IPv4", true: "IPv6"}[v6]
		pick := func(v4, v6addr netip.AddrPort) netip.AddrPort {
			if v6 {
				return v6addr
			}
			return v4
		}
		linkAddr := map[bool]netip.Addr{false: link1V4.Addr(), true: link1V6.Addr()}[v6]

		It("spreads a pod's ClusterIP connections over every endpoint keeping its source, and masquerades the node's own, over "+family, func() {
			vip := pick(cipWeb, cipWeb6)
			xs := exchanges(l.Pod(podC).NS, tcp(vip), connectionsPerFrontend, 4)
			expectSpread("pod -> ClusterIP "+family, xs, webPods)
			expectPreserved("pod -> ClusterIP "+family, xs)
			xs = exchanges(l.Pod(podC).NS, lab.Request{Proto: lab.UDP, Dst: vip}, connectionsPerFrontend/3, 4)
			expectSpread("pod -> ClusterIP, UDP, "+family, xs, webPods)
			expectPreserved("pod -> ClusterIP, UDP, "+family, xs)

			// The node's own connections leave from its eth1 address here, so that the
			// masquerade to a local pod (to the eth0 address) shows in the address.
			xs = exchanges(l.Node, bound(tcp(vip), linkAddr), 60, 2)
			answered("node -> ClusterIP "+family, xs)
			expectMasqueraded("node -> ClusterIP "+family, xs)
		})

		It("spreads external NodePort connections over every endpoint, masqueraded, over "+family, func() {
			xs := exchanges(l.Client, tcp(nodePortOf(v6, nodePortWeb)), connectionsPerFrontend, 4)
			expectSpread("external -> NodePort "+family, xs, webPods)
			expectMasqueraded("external -> NodePort "+family, xs)

			// The node port answers on every node address, here eth1's from the remote node.
			xs = exchanges(l.Remote, tcp(netip.AddrPortFrom(linkAddr, nodePortWeb)), 30, 2)
			counts := answered("remote node -> NodePort on eth1 "+family, xs)
			for pod := range counts {
				Expect(webPods).To(ContainElement(pod))
			}
			for i, x := range xs {
				Expect(x.reply.Source.Addr()).NotTo(Equal(x.reply.Local.Addr()), "remote node -> NodePort #%d: masqueraded", i)
			}

			// And the Service's ClusterIP from a pod.
			xs = exchanges(l.Pod(podC).NS, tcp(pick(cipNodePort, cipNodePort6)), 30, 2)
			answered("pod -> NodePort Service's ClusterIP "+family, xs)
			expectPreserved("pod -> NodePort Service's ClusterIP "+family, xs)
		})
	}

	It("spreads external LoadBalancer IP connections over every endpoint, masqueraded", func() {
		xs := exchanges(l.Client, tcp(lbWeb), connectionsPerFrontend, 4)
		expectSpread("external -> LoadBalancer IP", xs, webPods)
		expectMasqueraded("external -> LoadBalancer IP", xs)

		xs = exchanges(l.Client, tcp(nodePortOf(false, nodePortLB)), 30, 2)
		answered("external -> LoadBalancer's NodePort", xs)
		expectMasqueraded("external -> LoadBalancer's NodePort", xs)

		xs = exchanges(l.Pod(podC).NS, tcp(lbWeb), 30, 2)
		answered("pod -> LoadBalancer IP", xs)
		expectMasqueraded("pod -> LoadBalancer IP", xs)
	})

	It("spreads external ExternalIP connections over every endpoint, masqueraded", func() {
		xs := exchanges(l.Client, tcp(externalWeb), connectionsPerFrontend, 4)
		expectSpread("external -> ExternalIP", xs, webPods)
		expectMasqueraded("external -> ExternalIP", xs)

		xs = exchanges(l.Pod(podC).NS, tcp(cipExternal), 30, 2)
		answered("pod -> ExternalIP Service's ClusterIP", xs)
		expectPreserved("pod -> ExternalIP Service's ClusterIP", xs)
	})

	It("refuses what has no endpoint at once, and drops what only lacks a local endpoint", func() {
		pod := l.Pod(podC).NS
		refused, dropped := 0, 0
		refuse := func(from *lab.NS, req lab.Request) {
			GinkgoHelper()
			expectRefused(from, req)
			refused++
		}
		drop := func(from *lab.NS, req lab.Request) {
			GinkgoHelper()
			expectDropped(l, from, req)
			dropped++
		}
		for _, proto := range []lab.Proto{lab.TCP, lab.UDP} {
			// REJECT: a Service without endpoints, a ClusterIP on a port it does not
			// have, a node port without endpoints.
			refuse(pod, lab.Request{Proto: proto, Dst: cipEmpty})
			refuse(pod, lab.Request{Proto: proto, Dst: netip.AddrPortFrom(cipWeb.Addr(), 81)})
			refuse(l.Client, lab.Request{Proto: proto, Dst: nodePortOf(false, nodePortEmpty)})
		}
		// The node's own connection too; its UDP datagram would fail with EPERM
		// whether rejected or dropped, so only TCP tells.
		refuse(l.Node, tcp(cipEmpty))
		// DROP: the ETP Local frontends without a local endpoint, from outside, and an
		// unallocated address of the service CIDR.
		drop(l.Client, tcp(lbRemoteOnly))
		drop(l.Client, tcp(nodePortOf(false, nodePortRemote)))
		drop(pod, tcp(unallocated))
		drop(pod, lab.Request{Proto: lab.UDP, Dst: unallocated})

		// The void counter does see what is routed there: an address outside every
		// Service range times out too, but through void0.
		before := voidPackets(l)
		_, err := pod.Echo(lab.Request{Proto: lab.TCP, Dst: ap("172.31.0.1", 80), Timeout: dropTimeout})
		Expect(err).To(MatchError(lab.ErrTimeout))
		Expect(voidPackets(l)).To(BeNumerically(">", before), "control: traffic to nowhere leaves by void0")
		countConnections(1)
		report("reject/drop: %d exchanges refused within 500 ms, %d timed out (after %v) with nothing sent into the void", refused, dropped, dropTimeout)
	})

	It("keeps each client on one endpoint under sessionAffinity ClientIP", func() {
		chosen := map[string]string{}
		for _, client := range []string{podC, podD} {
			xs := exchanges(l.Pod(client).NS, tcp(cipSticky), 50, 1)
			counts := answered(client+" -> sticky ClusterIP", xs)
			Expect(counts).To(HaveLen(1), "%s: 50 connections must all reach one endpoint, got %v", client, counts)
			for pod := range counts {
				Expect(webPods).To(ContainElement(pod))
				chosen[client] = pod
			}
			expectPreserved(client+" -> sticky ClusterIP", xs)
		}
		report("sessionAffinity: 50 connections each, %s stuck to %s, %s stuck to %s", podC, chosen[podC], podD, chosen[podD])
	})

	It("lets only loadBalancerSourceRanges reach the load balancer IP, and leaves its node port open", func() {
		allowed, blocked := clientV4.Addr(), client2V4.Addr()
		xs := exchanges(l.Client, bound(tcp(lbRanged), allowed), 30, 2)
		counts := answered("allowed client -> ranged LoadBalancer IP", xs)
		expectMasqueraded("allowed client -> ranged LoadBalancer IP", xs)
		for range 3 {
			expectDropped(l, l.Client, bound(tcp(lbRanged), blocked))
		}
		xs = exchanges(l.Client, bound(tcp(nodePortOf(false, nodePortRanged)), blocked), 30, 2)
		answered("blocked client -> ranged Service's NodePort", xs)
		report("loadBalancerSourceRanges: allowed client 30/30 answered (%v), blocked client 3/3 timed out, blocked client via NodePort 30/30 answered", counts)
	})

	It("sends external ETP Local traffic to local endpoints only, keeping the client's address", func() {
		for _, dst := range []netip.AddrPort{lbLocal, nodePortOf(false, nodePortLocal)} {
			xs := exchanges(l.Client, tcp(dst), 100, 2)
			counts := answered("external -> ETP Local "+dst.String(), xs)
			Expect(counts).To(Equal(map[string]int{podA: 100}), "only the local endpoint")
			expectPreserved("external -> ETP Local "+dst.String(), xs)
		}
		// Pods use every endpoint, keeping their address.
		xs := exchanges(l.Pod(podC).NS, tcp(lbLocal), 100, 2)
		expectSpread("pod -> ETP Local LoadBalancer IP", xs, []string{podA, podR})
		expectPreserved("pod -> ETP Local LoadBalancer IP", xs)
		// Without a local endpoint: dropped from outside, served to pods.
		expectDropped(l, l.Client, tcp(lbRemoteOnly))
		expectDropped(l, l.Client, tcp(nodePortOf(false, nodePortRemote)))
		xs = exchanges(l.Pod(podC).NS, tcp(lbRemoteOnly), 20, 2)
		Expect(answered("pod -> ETP Local without local endpoint", xs)).To(Equal(map[string]int{podR: 20}))
		report("ETP Local: external 200/200 to the local endpoint with the client's address; no local endpoint: timeouts; pods use all endpoints")
	})
})
