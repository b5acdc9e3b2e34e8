package proxy_test

import (
	"net/netip"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/lab"
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

// dnsVIP is the ClusterIP of dnsService.
var dnsVIP = ap("172.30.0.40", 53)

// dnsService is the Service of the conntrack suite: one UDP port, as a cluster DNS.
func dnsService() *v1.Service {
	svc := service("dns", dnsVIP).obj()
	svc.Spec.Ports[0] = v1.ServicePort{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}
	return svc
}

var _ = Describe("Stale UDP conntrack entries", Label("kernel"), func() {
	It("are deleted when an endpoint goes away, so a UDP client moves to a live endpoint", func(ctx SpecContext) {
		l := newLab(topology())
		svc := dnsService()
		p := newNodeProxy(l, []*v1.Service{svc}, podSlices(svc, podA),
			withoutMirror(), withConntrack(nsCleaner{l.Node, conntrack.NewCleaner()}))
		Expect(p.Sync(ctx)).Error().NotTo(HaveOccurred())

		// One UDP "connection": the same client address and port every time, as a
		// resolver's long-lived socket.
		req := lab.Request{Proto: lab.UDP, Dst: dnsVIP, Src: netip.AddrPortFrom(podAddr(l, podC, false), 40053)}
		for range 3 {
			r, err := l.Pod(podC).Echo(req)
			Expect(err).NotTo(HaveOccurred())
			Expect(r.Pod).To(Equal(podA))
		}

		// pod-a leaves the Service (its echo server keeps running, so a stale entry
		// would still get answers from it).
		for _, s := range podSlices(svc, podB) {
			p.UpdateEndpointSlice(s)
		}
		Expect(p.Sync(ctx)).Error().NotTo(HaveOccurred())
		for range 3 {
			r, err := l.Pod(podC).Echo(req)
			Expect(err).NotTo(HaveOccurred())
			Expect(r.Pod).To(Equal(podB), "the flow still follows the removed endpoint's conntrack entry")
		}
	})

	It("would keep the client on the removed endpoint without the cleanup (control)", func(ctx SpecContext) {
		l := newLab(topology())
		svc := dnsService()
		p := newNodeProxy(l, []*v1.Service{svc}, podSlices(svc, podA), withoutMirror())
		Expect(p.Sync(ctx)).Error().NotTo(HaveOccurred())
		req := lab.Request{Proto: lab.UDP, Dst: dnsVIP, Src: netip.AddrPortFrom(podAddr(l, podC, false), 40053)}
		r, err := l.Pod(podC).Echo(req)
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Pod).To(Equal(podA))
		for _, s := range podSlices(svc, podB) {
			p.UpdateEndpointSlice(s)
		}
		Expect(p.Sync(ctx)).Error().NotTo(HaveOccurred())
		r, err = l.Pod(podC).Echo(req)
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Pod).To(Equal(podA), "without conntrack cleanup the kernel keeps the flow on its old endpoint; the first spec is meaningless if this changes")
	})
})
