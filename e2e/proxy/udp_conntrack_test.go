package proxy_test

import (
	"net/netip"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/conntrack"
)

// nsCleaner deletes conntrack entries in a lab namespace, as the daemon's cleaner does
// in the node's own namespace.
type nsCleaner struct {
	ns      *lab.NS
	cleaner *conntrack.Cleaner
}

func (c nsCleaner) Clear(filters []conntrack.Filter) (n uint, err error) {
	err = c.ns.Do(func() error {
		n, err = c.cleaner.Clear(filters)
		return err
	})
	return n, err
}

var _ = Describe("Stale UDP conntrack entries", Label("kernel"), func() {
	It("are deleted when an endpoint goes away, so a UDP client moves to a live endpoint", func(ctx SpecContext) {
		l := newLab(topology())
		p, err := proxier.New(proxier.Config{
			NodeName: localNode,
			Ruleset:  proxyConfig(),
			NewNFT: func(fam knftables.Family, table string) (knftables.Interface, error) {
				return lab.NFT(l.Node, fam, table)
			},
			Conntrack: nsCleaner{l.Node, conntrack.NewCleaner()},
		})
		Expect(err).NotTo(HaveOccurred())
		vip := ap("172.30.0.40", 53)
		svc := service("dns", vip).obj()
		svc.Spec.Ports[0] = v1.ServicePort{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}
		p.OnNodeUpdate(nodeObject())
		p.OnServiceUpdate(svc)
		for _, s := range podSlices(svc, podA) {
			p.OnEndpointSliceUpdate(s)
		}
		Expect(p.Sync(ctx)).To(Succeed())

		// One UDP "connection": the same client address and port every time, as a
		// resolver's long-lived socket.
		req := lab.Request{Proto: lab.UDP, Dst: vip, Src: netip.AddrPortFrom(podAddr(l, podC, false), 40053)}
		for range 3 {
			r, err := l.Pod(podC).Echo(req)
			Expect(err).NotTo(HaveOccurred())
			Expect(r.Pod).To(Equal(podA))
		}

		// pod-a leaves the Service (its echo server keeps running, so a stale entry
		// would still get answers from it).
		for _, s := range podSlices(svc, podB) {
			p.OnEndpointSliceUpdate(s)
		}
		Expect(p.Sync(ctx)).To(Succeed())
		for range 3 {
			r, err := l.Pod(podC).Echo(req)
			Expect(err).NotTo(HaveOccurred())
			Expect(r.Pod).To(Equal(podB), "the flow still follows the removed endpoint's conntrack entry")
		}
	})

	It("would keep the client on the removed endpoint without the cleanup (control)", func(ctx SpecContext) {
		l := newLab(topology())
		p, err := proxier.New(proxier.Config{
			NodeName: localNode,
			Ruleset:  proxyConfig(),
			NewNFT: func(fam knftables.Family, table string) (knftables.Interface, error) {
				return lab.NFT(l.Node, fam, table)
			},
		})
		Expect(err).NotTo(HaveOccurred())
		vip := ap("172.30.0.40", 53)
		svc := service("dns", vip).obj()
		svc.Spec.Ports[0] = v1.ServicePort{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}
		p.OnNodeUpdate(nodeObject())
		p.OnServiceUpdate(svc)
		for _, s := range podSlices(svc, podA) {
			p.OnEndpointSliceUpdate(s)
		}
		Expect(p.Sync(ctx)).To(Succeed())
		req := lab.Request{Proto: lab.UDP, Dst: vip, Src: netip.AddrPortFrom(podAddr(l, podC, false), 40053)}
		r, err := l.Pod(podC).Echo(req)
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Pod).To(Equal(podA))
		for _, s := range podSlices(svc, podB) {
			p.OnEndpointSliceUpdate(s)
		}
		Expect(p.Sync(ctx)).To(Succeed())
		r, err = l.Pod(podC).Echo(req)
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Pod).To(Equal(podA), "without conntrack cleanup the kernel keeps the flow on its old endpoint; the first spec is meaningless if this changes")
	})
})
