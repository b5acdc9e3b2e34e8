package lab_test

import (
	"context"
	"net/netip"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// Virtual IPs of the hand-written ruleset below.
var (
	vip        = netip.MustParseAddrPort("172.30.0.10:80")
	vip6       = netip.MustParseAddrPort("[fd00:30::10]:80")
	rejectedIP = netip.MustParseAddrPort("172.30.0.11:80")
	droppedIP  = netip.MustParseAddrPort("172.30.0.12:80")
	podAOnly   = netip.MustParseAddrPort("172.30.0.13:80")
)

// loadLabtest loads, through the knftables wrapper, table `labtest` (never "nftproxy") of
// family into the node: a VIP DNATed with numgen to pod-a and pod-b, a VIP DNATed to pod-a
// only, a reject and a drop.
func loadLabtest(ctx context.Context, l *lab.Lab, family knftables.Family) knftables.Interface {
	GinkgoHelper()
	nft, err := lab.NFT(l.Node, family, "labtest")
	Expect(err).NotTo(HaveOccurred())
	ip, a, b, v := "ip", l.Pod("pod-a").IPv4(), l.Pod("pod-b").IPv4(), vip.Addr()
	if family == knftables.IPv6Family {
		ip, a, b, v = "ip6", l.Pod("pod-a").IPv6(), l.Pod("pod-b").IPv6(), vip6.Addr()
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	for _, c := range []struct {
		name     string
		typ      knftables.BaseChainType
		hook     knftables.BaseChainHook
		priority knftables.BaseChainPriority
	}{
		{"prerouting", knftables.NATType, knftables.PreroutingHook, "-100"},
		{"postrouting", knftables.NATType, knftables.PostroutingHook, "100"},
		{"forward", knftables.FilterType, knftables.ForwardHook, "0"},
		{"trace", knftables.FilterType, knftables.PreroutingHook, "-300"},
	} {
		tx.Add(&knftables.Chain{Name: c.name, Type: &c.typ, Hook: &c.hook, Priority: &c.priority})
	}
	tx.Add(&knftables.Rule{Chain: "prerouting", Rule: knftables.Concat(
		ip, "daddr", v, "meta l4proto { tcp, udp } th dport 80",
		"dnat", ip, "to numgen random mod 2 map {",
		"0 :", a, ". 8080, 1 :", b, ". 8080 }",
	)})
	if family == knftables.IPv4Family {
		tx.Add(&knftables.Rule{Chain: "prerouting", Rule: knftables.Concat(
			"ip daddr", podAOnly.Addr(), "tcp dport 80 dnat ip to", a, ":8080")})
		tx.Add(&knftables.Rule{Chain: "forward", Rule: "ip daddr " + rejectedIP.Addr().String() + " reject"})
		tx.Add(&knftables.Rule{Chain: "forward", Rule: "ip daddr " + droppedIP.Addr().String() + " drop"})
	}
	Expect(nft.Run(ctx, tx)).To(Succeed())
	return nft
}

var _ = Describe("Lab with a hand-written DNAT ruleset", Label("kernel"), func() {
	var (
		l   *lab.Lab
		nft knftables.Interface
	)
	BeforeEach(func(ctx SpecContext) {
		l = newLab(dualStack())
		nft = loadLabtest(ctx, l, knftables.IPv4Family)
	})

	// spread sends n exchanges to dst from the client and counts the answering pods; each
	// answer must show the wanted source address.
	spread := func(proto lab.Proto, dst netip.AddrPort, n int, wantSrc netip.Addr) map[string]int {
		GinkgoHelper()
		count := map[string]int{}
		for i := 0; i < n; i++ {
			r, err := l.Client.Echo(lab.Request{Proto: proto, Dst: dst})
			Expect(err).NotTo(HaveOccurred(), "exchange %d", i)
			Expect(r.Source.Addr()).To(Equal(wantSrc))
			count[r.Pod]++
		}
		return count
	}

	It("loads the table in the node only, through knftables", func(ctx SpecContext) {
		Expect(nft.List(ctx, "chains")).To(ConsistOf("prerouting", "postrouting", "forward", "trace"))
		rules, err := nft.ListRules(ctx, "forward")
		Expect(err).NotTo(HaveOccurred())
		Expect(rules).To(HaveLen(2))
		_, err = nft.ListRules(ctx, "no-such-chain")
		Expect(knftables.IsNotFound(err)).To(BeTrue(), "knftables errors pass through unwrapped: %v", err)
		Expect(l.Node.Ruleset(ctx)).To(ContainSubstring("table ip labtest"))
		Expect(l.Client.Ruleset(ctx)).NotTo(ContainSubstring("labtest"))
	})

	It("splits 200 TCP connections between both pods, keeping the client's address", func() {
		start := time.Now()
		count := spread(lab.TCP, vip, 200, clientV4.Addr())
		GinkgoWriter.Printf("200 TCP connections through the VIP in %v: %v\n", time.Since(start), count)
		Expect(count).To(HaveLen(2))
		Expect(count["pod-a"]).To(BeNumerically(">", 40))
		Expect(count["pod-b"]).To(BeNumerically(">", 40))
	})

	It("carries UDP through the DNAT", func() {
		count := spread(lab.UDP, vip, 40, clientV4.Addr())
		Expect(count).To(HaveKey("pod-a"))
		Expect(count).To(HaveKey("pod-b"))
	})

	It("shows the node's address to the pods after a masquerade rule", func(ctx SpecContext) {
		tx := nft.NewTransaction()
		tx.Add(&knftables.Rule{Chain: "postrouting", Rule: "ct status dnat masquerade"})
		Expect(nft.Run(ctx, tx)).To(Succeed())
		count := spread(lab.TCP, vip, 20, nodeV4.Addr())
		Expect(count).To(HaveLen(2))
		spread(lab.UDP, vip, 5, nodeV4.Addr())
	})

	It("classifies a reject rule as refused, fast, and a drop rule as a timeout", func() {
		for _, proto := range []lab.Proto{lab.TCP, lab.UDP} {
			start := time.Now()
			_, err := l.Client.Echo(lab.Request{Proto: proto, Dst: rejectedIP, Timeout: 2 * time.Second})
			Expect(err).To(MatchError(lab.ErrRefused))
			Expect(time.Since(start)).To(BeNumerically("<", 500*time.Millisecond), "fast, not a timeout")

			start = time.Now()
			_, err = l.Client.Echo(lab.Request{Proto: proto, Dst: droppedIP, Timeout: 300 * time.Millisecond})
			Expect(err).To(MatchError(lab.ErrTimeout))
			Expect(time.Since(start)).To(BeNumerically(">=", 300*time.Millisecond))
		}
	})

	It("splits IPv6 connections too", func(ctx SpecContext) {
		loadLabtest(ctx, l, knftables.IPv6Family)
		count := spread(lab.TCP, vip6, 60, clientV6.Addr())
		Expect(count).To(HaveLen(2))
		count = spread(lab.UDP, vip6, 20, clientV6.Addr())
		Expect(count).To(HaveLen(2))
	})

	It("reaches the VIP from the remote pod", func() {
		r, err := l.Pod("pod-r").Echo(lab.Request{Proto: lab.TCP, Dst: vip})
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Pod).To(BeElementOf("pod-a", "pod-b"))
		Expect(r.Source).To(Equal(r.Local))
	})

	It("needs the masquerade for a pod reaching itself through the VIP (hairpin)", func(ctx SpecContext) {
		a := l.Pod("pod-a")
		// Without it, pod-a answers itself directly and the reply misses the un-DNAT.
		_, err := a.Echo(lab.Request{Proto: lab.TCP, Dst: podAOnly, Timeout: 200 * time.Millisecond})
		Expect(err).To(MatchError(lab.ErrTimeout))
		tx := nft.NewTransaction()
		tx.Add(&knftables.Rule{Chain: "postrouting", Rule: "ct status dnat masquerade"})
		Expect(nft.Run(ctx, tx)).To(Succeed())
		for _, dst := range []netip.AddrPort{podAOnly, vip, vip, vip, vip} {
			r, err := a.Echo(lab.Request{Proto: lab.TCP, Dst: dst})
			Expect(err).NotTo(HaveOccurred())
			Expect(r.Source.Addr()).To(Equal(nodeV4.Addr()))
		}
	})

	It("flushes the node's connection tracking table, both families", func(ctx SpecContext) {
		loadLabtest(ctx, l, knftables.IPv6Family) // the node tracks a family once a NAT table needs it
		spread(lab.TCP, vip, 5, clientV4.Addr())
		Expect(l.Pod("pod-a").Echo(lab.Request{Proto: lab.UDP, Dst: netip.AddrPortFrom(l.Pod("pod-b").IPv6(), 8080)})).
			Error().NotTo(HaveOccurred())
		flows := func() (n int) {
			Expect(l.Node.Do(func() error {
				for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
					fs, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
					if err != nil {
						return err
					}
					n += len(fs)
				}
				return nil
			})).To(Succeed())
			return n
		}
		Expect(flows()).To(BeNumerically(">=", 6))
		Expect(l.Node.FlushConntrack()).To(Succeed())
		Expect(flows()).To(BeZero())
	})

	It("captures nft monitor trace lines of traced packets", func(ctx SpecContext) {
		tx := nft.NewTransaction()
		tx.Add(&knftables.Rule{Chain: "trace", Rule: "ip daddr " + vip.Addr().String() + " meta nftrace set 1"})
		Expect(nft.Run(ctx, tx)).To(Succeed())
		trace, err := l.Node.StartTrace()
		Expect(err).NotTo(HaveOccurred())
		r, err := l.Client.Echo(lab.Request{Proto: lab.TCP, Dst: vip})
		Expect(err).NotTo(HaveOccurred())
		Eventually(trace.Lines).Should(ContainElement(ContainSubstring("dnat ip to")))
		lines, err := trace.Stop()
		Expect(err).NotTo(HaveOccurred())
		all := strings.Join(lines, "\n")
		Expect(all).To(ContainSubstring("ip labtest prerouting"))
		Expect(all).To(ContainSubstring("sport " + itoa(r.Local.Port())))
		Expect(trace.Stop()).Error().NotTo(HaveOccurred()) // idempotent
	})
})

func itoa(p uint16) string {
	return netip.AddrPortFrom(netip.IPv4Unspecified(), p).String()[len("0.0.0.0:"):]
}
