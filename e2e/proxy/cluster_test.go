package proxy_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// The topology every spec runs on: the node under test with four pods, a remote node with
// one pod, and an external client with two addresses per family (two clients, as far as
// source addresses go). All addresses are private to the lab's namespaces.
var (
	nodeV4    = netip.MustParsePrefix("192.168.10.1/24")
	nodeV6    = netip.MustParsePrefix("fd00:10::1/64")
	clientV4  = netip.MustParsePrefix("192.168.10.2/24")
	client2V4 = netip.MustParsePrefix("192.168.10.3/24")
	clientV6  = netip.MustParsePrefix("fd00:10::2/64")
	client2V6 = netip.MustParsePrefix("fd00:10::3/64")
	link1V4   = netip.MustParsePrefix("192.168.20.1/24")
	link1V6   = netip.MustParsePrefix("fd00:20::1/64")
	remoteV4  = netip.MustParsePrefix("192.168.20.2/24")
	remoteV6  = netip.MustParsePrefix("fd00:20::2/64")

	remotePodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24"), netip.MustParsePrefix("fd01:0:0:2::/64")}
)

// Node names as the EndpointSlices spell them.
const (
	localNode  = "node-1"
	remoteNode = "node-2"
)

// echoPort is the port every pod's echo servers listen on, the Services' target port.
const echoPort = lab.DefaultEchoPort

// Pods. pod-a, pod-b (on the node) and pod-r (on the remote node) are the endpoints of
// most Services; pod-c and pod-d are clients that no Service selects, so that their
// connections are never hairpinned.
const (
	podA = "pod-a"
	podB = "pod-b"
	podC = "pod-c"
	podD = "pod-d"
	podR = "pod-r"
)

// webPods are the endpoints of the fixture's ordinary Services.
var webPods = []string{podA, podB, podR}

// topology returns the lab every spec builds.
func topology() lab.Spec {
	return lab.Spec{
		NodeAddrs: []netip.Prefix{nodeV4, nodeV6},
		Pods: []lab.PodSpec{
			{Name: podA, Addrs: addrs("10.0.1.5", "fd01:0:0:1::5")},
			{Name: podB, Addrs: addrs("10.0.1.6", "fd01:0:0:1::6")},
			{Name: podC, Addrs: addrs("10.0.1.7", "fd01:0:0:1::7")},
			{Name: podD, Addrs: addrs("10.0.1.8", "fd01:0:0:1::8")},
		},
		Remote: &lab.RemoteSpec{
			NodeAddrs: []netip.Prefix{link1V4, link1V6},
			Addrs:     []netip.Prefix{remoteV4, remoteV6},
			PodCIDRs:  remotePodCIDRs,
			Pods:      []lab.PodSpec{{Name: podR, Addrs: addrs("10.0.2.5", "fd01:0:0:2::5")}},
		},
		Client: &lab.ClientSpec{Addrs: []netip.Prefix{clientV4, client2V4, clientV6, client2V6}},
	}
}

// proxyConfig is the proxier configuration of every spec: pod traffic told apart by the
// cluster CIDRs, one service CIDR per family.
func proxyConfig() ruleset.Config {
	cfg := ruleset.Config{
		LocalMode:    ruleset.LocalClusterCIDR,
		ClusterCIDRs: prefixes("10.0.0.0/8", "fd01::/48"),
		ServiceCIDRs: prefixes("172.30.0.0/16", "fd02::/112"),
	}
	cfg.Defaults()
	Expect(cfg.Validate()).To(Succeed())
	return cfg
}

// nodeObject is the Node of the node under test, with the addresses of both its links.
func nodeObject() *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: localNode}}
	for _, p := range []netip.Prefix{nodeV4, link1V4, nodeV6, link1V6} {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: p.Addr().String()})
	}
	return n
}

// Frontends of the fixture cluster (see fixtureObjects); every Service port is 80.
var (
	cipWeb        = ap("172.30.0.10", 80) // web: ClusterIP, dual-stack, TCP and UDP
	cipWeb6       = ap("fd02::10", 80)
	cipNodePort   = ap("172.30.0.11", 80) // web-np: NodePort nodePortWeb, dual-stack
	cipNodePort6  = ap("fd02::11", 80)
	cipLB         = ap("172.30.0.12", 80) // web-lb: LoadBalancer lbWeb, nodePortLB
	lbWeb         = ap("203.0.113.10", 80)
	cipExternal   = ap("172.30.0.13", 80) // web-eip: ClusterIP with ExternalIP externalWeb
	externalWeb   = ap("198.51.100.10", 80)
	cipSticky     = ap("172.30.0.14", 80) // sticky: sessionAffinity ClientIP
	cipRanged     = ap("172.30.0.15", 80) // ranged: LoadBalancer lbRanged, nodePortRanged, source range clientV4/32
	lbRanged      = ap("203.0.113.20", 80)
	cipLocal      = ap("172.30.0.16", 80) // local: LoadBalancer lbLocal, nodePortLocal, ETP Local; pod-a and pod-r
	lbLocal       = ap("203.0.113.30", 80)
	cipRemoteOnly = ap("172.30.0.17", 80) // remote-only: LoadBalancer lbRemoteOnly, nodePortRemote, ETP Local; pod-r
	lbRemoteOnly  = ap("203.0.113.31", 80)
	cipEmpty      = ap("172.30.0.20", 80) // empty: NodePort nodePortEmpty without endpoints
	unallocated   = ap("172.30.0.99", 80) // in the service CIDR, no Service's

	nodePortWeb    = uint16(30080)
	nodePortLB     = uint16(30081)
	nodePortEmpty  = uint16(30082)
	nodePortRanged = uint16(30083)
	nodePortLocal  = uint16(30084)
	nodePortRemote = uint16(30085)

	affinityTimeout = int32(10800)
)

// fixtureObjects returns the Services and EndpointSlices of the fixture cluster, one of
// each kind of frontend.
func fixtureObjects() ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	var svcs []*v1.Service
	var slices []*discoveryv1.EndpointSlice
	add := func(svc *v1.Service, pods ...string) {
		svcs = append(svcs, svc)
		slices = append(slices, podSlices(svc, pods...)...)
	}
	add(service("web", cipWeb, cipWeb6).udp().obj(), webPods...)
	add(service("web-np", cipNodePort, cipNodePort6).nodePort(nodePortWeb).obj(), webPods...)
	add(service("web-lb", cipLB).nodePort(nodePortLB).loadBalancer(lbWeb).obj(), webPods...)
	add(service("web-eip", cipExternal).externalIPs(externalWeb).obj(), webPods...)
	add(service("sticky", cipSticky).affinity().obj(), webPods...)
	add(service("ranged", cipRanged).nodePort(nodePortRanged).loadBalancer(lbRanged).
		sourceRanges(netip.PrefixFrom(clientV4.Addr(), 32)).obj(), webPods...)
	add(service("local", cipLocal).nodePort(nodePortLocal).loadBalancer(lbLocal).etpLocal().obj(), podA, podR)
	add(service("remote-only", cipRemoteOnly).nodePort(nodePortRemote).loadBalancer(lbRemoteOnly).etpLocal().obj(), podR)
	add(service("empty", cipEmpty).nodePort(nodePortEmpty).obj())
	return svcs, slices
}

// svcBuilder builds a v1.Service of the fixture.
type svcBuilder struct{ svc *v1.Service }

// service starts a ClusterIP Service default/name with one TCP port "http" (the port of
// the first ClusterIP; EndpointSlices give the target port).
func service(name string, clusterIPs ...netip.AddrPort) svcBuilder {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type:  v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: int32(clusterIPs[0].Port())}},
		},
	}
	for _, c := range clusterIPs {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, c.Addr().String())
	}
	svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	return svcBuilder{svc}
}

// obj returns the Service built.
func (b svcBuilder) obj() *v1.Service { return b.svc }

// nodePort gives the first port node port p, making a ClusterIP Service a NodePort one.
func (b svcBuilder) nodePort(p uint16) svcBuilder {
	if b.svc.Spec.Type == v1.ServiceTypeClusterIP {
		b.svc.Spec.Type = v1.ServiceTypeNodePort
	}
	b.svc.Spec.Ports[0].NodePort = int32(p)
	return b
}

// loadBalancer makes the Service a LoadBalancer with the addresses of ips as ingress IPs.
func (b svcBuilder) loadBalancer(ips ...netip.AddrPort) svcBuilder {
	b.svc.Spec.Type = v1.ServiceTypeLoadBalancer
	for _, ip := range ips {
		b.svc.Status.LoadBalancer.Ingress = append(b.svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip.Addr().String()})
	}
	return b
}

// externalIPs adds the addresses of ips as ExternalIPs.
func (b svcBuilder) externalIPs(ips ...netip.AddrPort) svcBuilder {
	for _, ip := range ips {
		b.svc.Spec.ExternalIPs = append(b.svc.Spec.ExternalIPs, ip.Addr().String())
	}
	return b
}

// affinity turns on sessionAffinity ClientIP.
func (b svcBuilder) affinity() svcBuilder {
	b.svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	b.svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &affinityTimeout}}
	return b
}

// sourceRanges adds loadBalancerSourceRanges.
func (b svcBuilder) sourceRanges(ps ...netip.Prefix) svcBuilder {
	for _, p := range ps {
		b.svc.Spec.LoadBalancerSourceRanges = append(b.svc.Spec.LoadBalancerSourceRanges, p.String())
	}
	return b
}

// udp adds a UDP port "udp" with the number of the TCP one.
func (b svcBuilder) udp() svcBuilder {
	b.svc.Spec.Ports = append(b.svc.Spec.Ports, v1.ServicePort{Name: "udp", Protocol: v1.ProtocolUDP, Port: b.svc.Spec.Ports[0].Port})
	return b
}

// etpLocal sets externalTrafficPolicy Local.
func (b svcBuilder) etpLocal() svcBuilder {
	b.svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	return b
}

// podSlices returns the EndpointSlices (one per family) of svc with the named lab pods as
// endpoints: every port of the Service targets echoPort.
func podSlices(svc *v1.Service, pods ...string) []*discoveryv1.EndpointSlice {
	spec := topology()
	var v4, v6 []endpoint
	for _, name := range pods {
		p, node := podSpec(spec, name)
		for _, a := range p.Addrs {
			e := endpoint{addr: a, node: node}
			if a.Is4() {
				v4 = append(v4, e)
			} else {
				v6 = append(v6, e)
			}
		}
	}
	var ports []discoveryv1.EndpointPort
	for _, sp := range svc.Spec.Ports {
		ports = append(ports, discoveryv1.EndpointPort{Name: ptr(sp.Name), Protocol: ptr(sp.Protocol), Port: ptr(int32(echoPort))})
	}
	return []*discoveryv1.EndpointSlice{
		endpointSlice(svc.Name, svc.Name+"-v4", false, ports, v4...),
		endpointSlice(svc.Name, svc.Name+"-v6", true, ports, v6...),
	}
}

// podSpec finds a pod of the topology and the name of its node.
func podSpec(spec lab.Spec, name string) (lab.PodSpec, string) {
	for _, p := range spec.Pods {
		if p.Name == name {
			return p, localNode
		}
	}
	for _, p := range spec.Remote.Pods {
		if p.Name == name {
			return p, remoteNode
		}
	}
	Fail("no pod " + name + " in the topology")
	return lab.PodSpec{}, ""
}

// endpoint is an endpoint address and the node it runs on.
type endpoint struct {
	addr netip.Addr
	node string
}

// endpointSlice returns EndpointSlice default/name of Service default/svc, of the IPv6
// address type when v6, with ports and ready endpoints eps.
func endpointSlice(svc, name string, v6 bool, ports []discoveryv1.EndpointPort, eps ...endpoint) *discoveryv1.EndpointSlice {
	typ := discoveryv1.AddressTypeIPv4
	if v6 {
		typ = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: typ,
		Ports:       ports,
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.addr.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr(e.node),
		})
	}
	return s
}

// nodeProxy is the proxier under test on the lab's node: a proxier.Proxier, as the daemon
// runs it, fed Kubernetes objects through its informer handlers, whose nft runs in the
// node's namespace (lab.NFT) and whose element batches go over netlink into the same
// namespace. A second Proxier, the mirror, is fed the very same events and writes into
// knftables.Fakes, its element batches decoded back from netlink (syncer.DecodedNetlink),
// so that the simulator can read the ruleset in the very text and batches the proxier
// sends.
type nodeProxy struct {
	cfg    ruleset.Config
	kernel *proxier.Proxier
	// nft are the kernel Proxier's tables, as its NewNFT opened them.
	nft map[knftables.Family]knftables.Interface
	// mirror writes fakes; nil when the spec does without it (withoutMirror).
	mirror *proxier.Proxier
	fakes  map[knftables.Family]*knftables.Fake

	// mu serializes Sync, FullSync and Tidy, so that sum and the counters below belong
	// to one sync at a time.
	mu sync.Mutex
	// sum adds up what the kernel Proxier reported of each family's sync (OnSynced)
	// during the sync running.
	sum syncer.Result
	// Syncs counts the syncs that ran a transaction in some family, FullSyncs those of
	// them that were full in some family; Operations counts the nft operations of all,
	// FullOperations those of the full ones.
	Syncs, FullSyncs, Operations, FullOperations int
}

// families are the families the proxier programs.
var families = []knftables.Family{knftables.IPv4Family, knftables.IPv6Family}

// proxyOptions are the choices of a spec about its nodeProxy.
type proxyOptions struct {
	mirror    bool
	conntrack proxier.ConntrackCleaner
}

// proxyOption changes the default proxyOptions: a mirror, no conntrack cleanup.
type proxyOption func(*proxyOptions)

// withoutMirror leaves the mirror out, for specs that do not involve the simulator: it
// saves the Fake's time.
func withoutMirror() proxyOption { return func(o *proxyOptions) { o.mirror = false } }

// withConntrack makes the kernel Proxier delete stale conntrack entries through c after
// each sync, as the daemon does.
func withConntrack(c proxier.ConntrackCleaner) proxyOption {
	return func(o *proxyOptions) { o.conntrack = c }
}

// newNodeProxy returns a proxier for the lab's node that has received the Node, svcs and
// slices and knows nothing of the kernel's tables yet, as after a (re)start. It does not
// sync.
func newNodeProxy(l *lab.Lab, svcs []*v1.Service, slices []*discoveryv1.EndpointSlice, opts ...proxyOption) *nodeProxy {
	GinkgoHelper()
	o := proxyOptions{mirror: true}
	for _, opt := range opts {
		opt(&o)
	}
	p := &nodeProxy{
		cfg:   proxyConfig(),
		nft:   map[knftables.Family]knftables.Interface{},
		fakes: map[knftables.Family]*knftables.Fake{},
	}
	var err error
	p.kernel, err = proxier.New(proxier.Config{
		NodeName: localNode,
		Ruleset:  p.cfg,
		Families: families,
		NewNFT: func(fam knftables.Family, table string) (knftables.Interface, error) {
			nft, err := lab.NFT(l.Node, fam, table)
			if err != nil {
				return nil, err
			}
			p.nft[fam] = nft
			return nft, nil
		},
		Netlink: func(knftables.Family, knftables.Interface) syncer.Transport {
			return syncer.KernelNetlink(l.Node.Do)
		},
		Conntrack: o.conntrack,
		OnSynced:  p.synced,
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(p.kernel.Close) // its netlink sockets hold the node's namespace
	Expect(p.kernel.Families()).To(Equal(families), "the proxier must program both families")
	if o.mirror {
		p.mirror, err = proxier.New(proxier.Config{
			NodeName: localNode,
			Ruleset:  p.cfg,
			Families: families,
			NewNFT: func(fam knftables.Family, table string) (knftables.Interface, error) {
				p.fakes[fam] = knftables.NewFake(fam, table)
				return p.fakes[fam], nil
			},
			Netlink: func(_ knftables.Family, nft knftables.Interface) syncer.Transport {
				return syncer.DecodedNetlink(nft)
			},
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(p.mirror.Families()).To(Equal(families), "the mirror must program both families")
	}
	p.UpdateNode(nodeObject())
	for _, s := range svcs {
		p.UpdateService(s)
	}
	for _, s := range slices {
		p.UpdateEndpointSlice(s)
	}
	return p
}

// startProxy builds the fixture cluster's proxier on l and applies its first (full) sync.
func startProxy(ctx context.Context, l *lab.Lab, opts ...proxyOption) *nodeProxy {
	GinkgoHelper()
	svcs, slices := fixtureObjects()
	p := newNodeProxy(l, svcs, slices, opts...)
	res, err := p.Sync(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(res.Full).To(BeTrue(), "the first sync is full")
	return p
}

// proxiers returns the kernel Proxier and, when there is one, the mirror.
func (p *nodeProxy) proxiers() []*proxier.Proxier {
	if p.mirror == nil {
		return []*proxier.Proxier{p.kernel}
	}
	return []*proxier.Proxier{p.kernel, p.mirror}
}

// expectValid asserts that the proxier skipped no object it received as invalid: the
// fixture's objects are all valid, so a skipped one would leave its Service out unseen.
func (p *nodeProxy) expectValid() {
	GinkgoHelper()
	Expect(p.kernel.Tracker().Errors()).To(BeEmpty(), "objects the proxier skipped as invalid")
}

// UpdateNode hands the proxiers the node's Node, as the daemon's informer does.
func (p *nodeProxy) UpdateNode(n *v1.Node) {
	GinkgoHelper()
	for _, x := range p.proxiers() {
		x.OnNodeUpdate(n)
	}
	p.expectValid()
}

// UpdateService hands the proxiers an added or changed Service.
func (p *nodeProxy) UpdateService(svc *v1.Service) {
	GinkgoHelper()
	for _, x := range p.proxiers() {
		x.OnServiceUpdate(svc)
	}
	p.expectValid()
}

// DeleteService tells the proxiers that a Service is gone.
func (p *nodeProxy) DeleteService(svc *v1.Service) {
	for _, x := range p.proxiers() {
		x.OnServiceDelete(svc)
	}
}

// UpdateEndpointSlice hands the proxiers an added or changed EndpointSlice.
func (p *nodeProxy) UpdateEndpointSlice(s *discoveryv1.EndpointSlice) {
	GinkgoHelper()
	for _, x := range p.proxiers() {
		x.OnEndpointSliceUpdate(s)
	}
	p.expectValid()
}

// DeleteEndpointSlice tells the proxiers that an EndpointSlice is gone.
func (p *nodeProxy) DeleteEndpointSlice(s *discoveryv1.EndpointSlice) {
	for _, x := range p.proxiers() {
		x.OnEndpointSliceDelete(s)
	}
}

// synced is the kernel Proxier's OnSynced: it adds a family's sync to the running sync's
// sum. It runs inside Proxier.SyncMode, hence under p.mu.
func (p *nodeProxy) synced(_ knftables.Family, _ *ruleset.Ruleset, res syncer.Result) {
	p.sum.Full = p.sum.Full || res.Full
	p.sum.Operations += res.Operations
	p.sum.NetlinkElements += res.NetlinkElements
	p.sum.Deleted = p.sum.Deleted || res.Deleted
}

// Sync is the event-driven sync (Proxier.Sync) of the kernel Proxier, then of the mirror:
// it brings every family's table to the events received, incrementally unless a full sync
// is needed. It returns what the kernel Proxier's families did, summed.
func (p *nodeProxy) Sync(ctx context.Context) (syncer.Result, error) { return p.sync(ctx, false) }

// FullSync is the periodic resync (Proxier.SyncMode with full): every family's table is
// rewritten.
func (p *nodeProxy) FullSync(ctx context.Context) (syncer.Result, error) { return p.sync(ctx, true) }

func (p *nodeProxy) sync(ctx context.Context, full bool) (syncer.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sum = syncer.Result{}
	if err := p.kernel.SyncMode(ctx, full); err != nil {
		return p.sum, err
	}
	sum := p.sum
	if p.mirror != nil {
		if err := p.mirror.SyncMode(ctx, full); err != nil {
			return sum, fmt.Errorf("mirror: %w", err)
		}
	}
	if sum.Operations > 0 {
		p.Syncs++
		p.Operations += sum.Operations
		if sum.Full {
			p.FullSyncs++
			p.FullOperations += sum.Operations
		}
	}
	return sum, nil
}

// Tidy removes the emptied objects incremental syncs kept from the kernel's tables (and
// the mirror's), so that they hold exactly what the last sync applied.
func (p *nodeProxy) Tidy(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range p.proxiers() {
		if err := x.Tidy(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Applied returns the ruleset the kernel Proxier's last sync of fam applied.
func (p *nodeProxy) Applied(fam knftables.Family) *ruleset.Ruleset { return p.kernel.Applied(fam) }

// FakeDump returns what the mirror wrote, both families, as nft text: what the proxier
// sends to the kernel.
func (p *nodeProxy) FakeDump() string {
	GinkgoHelper()
	Expect(p.mirror).NotTo(BeNil(), "FakeDump needs the mirror")
	return p.fakes[knftables.IPv4Family].Dump() + p.fakes[knftables.IPv6Family].Dump()
}

// nodePortOf returns the node's eth0 address of the family, at port.
func nodePortOf(v6 bool, port uint16) netip.AddrPort {
	if v6 {
		return netip.AddrPortFrom(nodeV6.Addr(), port)
	}
	return netip.AddrPortFrom(nodeV4.Addr(), port)
}

// podAddr returns the address of the family of the named pod.
func podAddr(l *lab.Lab, name string, v6 bool) netip.Addr {
	p := l.Pod(name)
	if v6 {
		return p.IPv6()
	}
	return p.IPv4()
}

// masqAddr is the address the node masquerades connections to the named pod to: that of
// the interface towards the pod. Pod veths have no address of their own, so for the node's
// pods the kernel picks eth0's, the first of the node's interfaces with an address.
func masqAddr(pod string, v6 bool) netip.Addr {
	switch {
	case pod == podR && v6:
		return link1V6.Addr()
	case pod == podR:
		return link1V4.Addr()
	case v6:
		return nodeV6.Addr()
	}
	return nodeV4.Addr()
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func ap(addr string, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(addr), port)
}

func ptr[T any](v T) *T { return &v }
