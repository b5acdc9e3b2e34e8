package cluster

import (
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/packet"
)

// translator renames a scenario's world into the lab's (see peer_features_test.go).
type translator struct {
	c     *Cluster
	sc    *features.Scenario
	index int
	// hosts is the next host number of a pod address, shared by all scenarios so that
	// their pods do not collide; pods numbers the scenario's pod addresses.
	hosts *int
	pods  map[netip.Addr]int
	// local are the scenario's pod addresses on its own node: they become twins.
	local map[netip.Addr]bool
	// addrs maps Service addresses (ClusterIPs, the service CIDR, external and
	// load-balancer IPs) and ports node ports.
	addrs map[netip.Addr]netip.Addr
	ports map[int32]int32
}

// The compared nodes' names and the other node's, as the replay writes them.
var comparedNodes = [2]string{"node-a", "node-b"}

const otherNode = "node-c"

func newTranslator(c *Cluster, sc *features.Scenario, index int, hosts *int) *translator {
	return &translator{c: c, sc: sc, index: index, hosts: hosts, pods: map[netip.Addr]int{},
		local: map[netip.Addr]bool{}, addrs: map[netip.Addr]netip.Addr{}, ports: map[int32]int32{}}
}

// name is the lab's name of a scenario object: every scenario's objects live in the
// default namespace.
func (tr *translator) name(ns, name string) string {
	n := fmt.Sprintf("f%d-%s-%s", tr.index, ns, name)
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// serviceAddr maps a ClusterIP (or service-CIDR address) to 172.30.(64+index).N and
// any other Service address (external, load balancer) to 100.65.index.N; an IPv6 one
// to the same last two bytes in the lab's IPv6 service CIDR, or in otherServices6.
func (tr *translator) serviceAddr(a netip.Addr, clusterIP bool) netip.Addr {
	if m, ok := tr.addrs[a]; ok {
		return m
	}
	n := byte(len(tr.addrs) + 1)
	m := netip.AddrFrom4([4]byte{100, 65, byte(tr.index), n})
	switch {
	case a.Is6() && clusterIP:
		m = withLast2(tr.c.Spec.ServiceCIDR6.Addr(), 64+tr.index, n)
	case a.Is6():
		m = withLast2(otherServices6.Addr(), tr.index, n)
	case clusterIP:
		m = netip.AddrFrom4([4]byte{172, 30, byte(64 + tr.index), n})
	}
	tr.addrs[a] = m
	return m
}

// otherServices6 holds the IPv6 external and load-balancer addresses of the replay, as
// 100.65.0.0/16 does the IPv4 ones: outside every network of the lab.
var otherServices6 = netip.MustParsePrefix("fd00:100:65::/48")

// withLast2 returns the IPv6 address a with its last two bytes hi and lo.
func withLast2(a netip.Addr, hi int, lo byte) netip.Addr {
	b := a.As16()
	b[14], b[15] = byte(hi), lo
	return netip.AddrFrom16(b)
}

// keeps reports whether the replay keeps an address of a's family: IPv4 always, IPv6 in
// a dual-stack lab.
func (tr *translator) keeps(a netip.Addr) bool { return a.Is4() || tr.c.Spec.DualStack }

// nodePort maps a node port to 30000 + 40*index + N.
func (tr *translator) nodePort(p int32) int32 {
	if p == 0 {
		return 0
	}
	if m, ok := tr.ports[p]; ok {
		return m
	}
	m := int32(30000 + 40*tr.index + len(tr.ports))
	tr.ports[p] = m
	return m
}

// isServiceCIDR reports whether a is in the scenario's service CIDRs.
func (tr *translator) isServiceCIDR(a netip.Addr) bool {
	return slices.ContainsFunc(tr.sc.Config.ServiceCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
}

// isPod reports whether a is a pod address of the scenario: in its cluster CIDRs or
// its node's pod CIDRs, or, where it has no cluster CIDR of a's family (a scenario
// without a local-traffic detector of the family), any address but its node's.
func (tr *translator) isPod(a netip.Addr) bool {
	if !slices.ContainsFunc(tr.sc.Config.ClusterCIDRs, func(p netip.Prefix) bool { return p.Addr().Is6() == a.Is6() }) &&
		!tr.isNode(a) && !tr.isServiceCIDR(a) {
		return true
	}
	return slices.ContainsFunc(tr.sc.Config.ClusterCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) ||
		slices.ContainsFunc(tr.sc.Node.PodCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
}

func (tr *translator) isNode(a netip.Addr) bool { return slices.Contains(tr.sc.Node.Addresses, a) }

// podAddr is the lab address of scenario pod a: on the compared node of side (0 or 1),
// or on node-c for side -1, in the node's pod CIDR of a's family.
func (tr *translator) podAddr(a netip.Addr, side int) netip.Addr {
	h, ok := tr.pods[a]
	if !ok {
		h = *tr.hosts
		if *tr.hosts++; *tr.hosts > 254 {
			*tr.hosts = 60
		}
		tr.pods[a] = h
	}
	node := otherNode
	if side >= 0 {
		node = comparedNodes[side]
	}
	if a.Is6() {
		return withLast2(tr.c.Node(node).PodCIDR6.Addr(), 0, byte(h))
	}
	b := tr.c.Node(node).PodCIDR.Addr().As4()
	b[3] = byte(h)
	return netip.AddrFrom4(b)
}

// nodeAddr is the address of the lab's node of a's family.
func nodeAddr(n *Node, a netip.Addr) netip.Addr {
	if a.Is6() {
		return n.Addr6
	}
	return n.Addr
}

// service translates a Service, IPv4 only unless the lab is dual-stack; nil when it has
// no ClusterIP left. Its IP families follow its ClusterIPs'.
func (tr *translator) service(in *v1.Service) *v1.Service {
	svc := in.DeepCopy()
	svc.ObjectMeta = objectMeta(tr.name(in.Namespace, in.Name), in.Labels)
	spec := &svc.Spec
	spec.Selector = nil // selector-less: the replay writes the slices
	spec.IPFamilies, spec.IPFamilyPolicy = nil, nil
	if (spec.ClusterIP != "" || len(spec.ClusterIPs) > 0) && spec.ClusterIP != v1.ClusterIPNone {
		var ips []string
		var fams []v1.IPFamily
		for _, s := range append([]string{spec.ClusterIP}, spec.ClusterIPs...) {
			a, err := netip.ParseAddr(s)
			fam := map[bool]v1.IPFamily{true: v1.IPv4Protocol, false: v1.IPv6Protocol}[a.Is4()]
			if err == nil && tr.keeps(a) && !slices.Contains(fams, fam) {
				ips, fams = append(ips, tr.serviceAddr(a, true).String()), append(fams, fam)
			}
		}
		if len(ips) == 0 {
			return nil
		}
		spec.ClusterIP, spec.ClusterIPs = ips[0], ips
		if tr.c.Spec.DualStack {
			policy := map[bool]v1.IPFamilyPolicy{true: v1.IPFamilyPolicyRequireDualStack, false: v1.IPFamilyPolicySingleStack}[len(ips) == 2]
			spec.IPFamilies, spec.IPFamilyPolicy = fams, &policy
		}
	} else if spec.ClusterIP == v1.ClusterIPNone {
		spec.ClusterIPs = []string{v1.ClusterIPNone}
	}
	spec.ExternalIPs = tr.externals(spec.ExternalIPs)
	if spec.LoadBalancerIP != "" {
		if ips := tr.externals([]string{spec.LoadBalancerIP}); len(ips) > 0 {
			spec.LoadBalancerIP = ips[0]
		} else {
			spec.LoadBalancerIP = ""
		}
	}
	for i := range spec.Ports {
		spec.Ports[i].NodePort = tr.nodePort(spec.Ports[i].NodePort)
	}
	spec.HealthCheckNodePort = tr.nodePort(spec.HealthCheckNodePort)
	var ing []v1.LoadBalancerIngress
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if ips := tr.externals([]string{in.IP}); len(ips) > 0 {
			in.IP = ips[0]
			ing = append(ing, in)
		}
	}
	svc.Status = v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: ing}}
	return svc
}

// externals translates the external or load-balancer addresses the replay keeps.
func (tr *translator) externals(in []string) []string {
	var out []string
	for _, s := range in {
		if a, err := netip.ParseAddr(s); err == nil && tr.keeps(a) {
			out = append(out, tr.serviceAddr(a, false).String())
		}
	}
	return out
}

// slice translates an IPv4 EndpointSlice: an endpoint on the scenario's node becomes
// two, one on each compared node; any other goes to node-c.
func (tr *translator) slice(in *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	s := in.DeepCopy()
	s.ObjectMeta = objectMeta(tr.name(in.Namespace, in.Name), in.Labels)
	s.Labels[discoveryv1.LabelManagedBy] = peerManagedBy
	if svc := in.Labels[discoveryv1.LabelServiceName]; svc != "" {
		s.Labels[discoveryv1.LabelServiceName] = tr.name(in.Namespace, svc)
	}
	s.Endpoints = nil
	for _, ep := range in.Endpoints {
		local := ep.NodeName != nil && *ep.NodeName == tr.sc.Node.Name
		for _, a := range ep.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil && (tr.isNode(ip) || slices.ContainsFunc(tr.sc.Node.PodCIDRs,
				func(p netip.Prefix) bool { return p.Contains(ip) })) {
				local = true
			}
		}
		if !local {
			s.Endpoints = append(s.Endpoints, tr.endpoint(ep, -1))
			continue
		}
		for _, a := range ep.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				tr.local[ip] = true
			}
		}
		for side := range comparedNodes {
			s.Endpoints = append(s.Endpoints, tr.endpoint(ep, side))
		}
	}
	return s
}

// endpoint translates an endpoint to the compared node of side, or to node-c (-1).
func (tr *translator) endpoint(in discoveryv1.Endpoint, side int) discoveryv1.Endpoint {
	ep := *in.DeepCopy()
	ep.TargetRef = nil
	for i, s := range ep.Addresses {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil:
		case tr.isNode(a) && side >= 0:
			ep.Addresses[i] = nodeAddr(tr.c.Node(comparedNodes[side]), a).String()
		case tr.isPod(a):
			ep.Addresses[i] = tr.podAddr(a, side).String()
		}
	}
	node := otherNode
	if side >= 0 {
		node = comparedNodes[side]
	}
	ep.NodeName = &node
	ep.Zone = nil
	if ep.Hints != nil {
		h := discoveryv1.EndpointHints{}
		for _, z := range ep.Hints.ForZones {
			for _, m := range tr.zones(z.Name, side) {
				h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: m})
			}
		}
		for _, n := range ep.Hints.ForNodes {
			for _, m := range tr.nodes(n.Name, side) {
				h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: m})
			}
		}
		ep.Hints = &h
	}
	return ep
}

// zones translates a hint's zone: the scenario node's is the compared node's own (both
// nodes' for an endpoint on node-c), any other a zone of the scenario's own.
func (tr *translator) zones(z string, side int) []string {
	if z != tr.sc.Node.Zone || z == "" {
		return []string{fmt.Sprintf("f%d-%s", tr.index, z)}
	}
	if side >= 0 {
		return []string{"zone-" + comparedNodes[side]}
	}
	return []string{"zone-" + comparedNodes[0], "zone-" + comparedNodes[1]}
}

// nodes translates a hint's node name as zones does zones.
func (tr *translator) nodes(n string, side int) []string {
	if n != tr.sc.Node.Name {
		return []string{fmt.Sprintf("f%d-%s", tr.index, n)}
	}
	if side >= 0 {
		return []string{comparedNodes[side]}
	}
	return comparedNodes[:]
}

// objectMeta is the lab's metadata of a scenario object: its new name in the default
// namespace, its labels.
func objectMeta(name string, labels map[string]string) metav1.ObjectMeta {
	l := map[string]string{}
	maps.Copy(l, labels)
	return metav1.ObjectMeta{Name: name, Namespace: "default", Labels: l}
}

// podSide is the side a scenario pod address is translated to: the compared node's for
// a pod of the scenario's node, else node-c (-1).
func (tr *translator) podSide(a netip.Addr, side int) int {
	if tr.local[a] || slices.ContainsFunc(tr.sc.Node.PodCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
		return side
	}
	return -1
}

// packet translates a scenario packet to the compared node of side; it returns the
// canonical name of its source too.
func (tr *translator) packet(st *features.Step, side int, node *Node) packet.Packet {
	p := *st.Packet
	src, dst := p.Src.Addr(), p.Dst.Addr()
	p.IIf, p.OIf = "eth0", ""
	switch st.From {
	case features.FromPod:
		src, p.IIf = tr.podAddr(src, side), "vethreplay"
	case features.FromRemotePod:
		src = tr.podAddr(src, -1)
	case features.FromNode:
		src, p.IIf = nodeAddr(node, src), ""
	}
	dport := p.Dst.Port()
	switch {
	case tr.isNode(dst):
		dst = nodeAddr(node, dst)
		if dport >= 30000 && dport <= 32767 || tr.ports[int32(dport)] != 0 {
			dport = uint16(tr.nodePort(int32(dport)))
		}
	case tr.isServiceCIDR(dst):
		dst = tr.serviceAddr(dst, true)
	case tr.addrs[dst].IsValid():
		dst = tr.addrs[dst]
	case tr.isPod(dst):
		dst = tr.podAddr(dst, tr.podSide(dst, side))
	}
	p.Src = netip.AddrPortFrom(src, p.Src.Port())
	p.Dst = netip.AddrPortFrom(dst, dport)
	return p
}

// TestTranslator translates features/topology/hints.yaml for a lab of three nodes and
// checks the twins: the endpoint of the scenario's node on both compared nodes, hinted
// for each one's own zone; the others on node-c, hinted for both compared nodes' zone
// when they were for the scenario node's; a pod packet from each side's twin address.
func TestTranslator(t *testing.T) {
	sc, err := features.LoadFile(filepath.Join(repoRoot, "features/topology/hints.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{}
	for i, name := range []string{"node-a", "node-b", "node-c"} {
		c.Nodes = append(c.Nodes, &Node{Spec: NodeSpec{Name: name}, Addr: netip.AddrFrom4([4]byte{192, 168, 80, byte(11 + i)}),
			PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 80, byte(1 + i), 0}), 24)})
	}
	hosts := 60
	tr := newTranslator(c, sc, 3, &hosts)
	objs, err := decodeDocs(sc.Cluster.Text)
	if err != nil {
		t.Fatal(err)
	}
	svc := tr.service(objs[0].(*v1.Service))
	if svc.Name != "f3-shop-hinted" || svc.Spec.ClusterIP != "172.30.67.1" || svc.Spec.Ports[0].NodePort != 30120 {
		t.Errorf("service: %s %s node port %d, want f3-shop-hinted 172.30.67.1 node port 30120",
			svc.Name, svc.Spec.ClusterIP, svc.Spec.Ports[0].NodePort)
	}
	var got []string
	for _, ep := range tr.slice(objs[1].(*discoveryv1.EndpointSlice)).Endpoints {
		var zones []string
		if ep.Hints != nil {
			for _, z := range ep.Hints.ForZones {
				zones = append(zones, z.Name)
			}
		}
		got = append(got, fmt.Sprintf("%s@%s%v", ep.Addresses[0], *ep.NodeName, zones))
	}
	want := []string{"10.80.1.60@node-a[zone-node-a]", "10.80.2.60@node-b[zone-node-b]",
		"10.80.3.61@node-c[f3-zone-b]", "10.80.3.62@node-c[zone-node-a zone-node-b]", "10.80.3.63@node-c[]"}
	if !slices.Equal(got, want) {
		t.Errorf("endpoints:\n got %v\nwant %v", got, want)
	}
	st := &features.Step{Packet: &packet.Packet{Protocol: packet.TCP, Src: netip.MustParseAddrPort("10.1.0.20:40000"),
		Dst: netip.MustParseAddrPort("192.168.0.10:31100")}, From: features.FromPod}
	for side, want := range []string{"tcp 10.80.1.60:40000 -> 192.168.80.11:30120 iif vethreplay",
		"tcp 10.80.2.60:40000 -> 192.168.80.12:30120 iif vethreplay"} {
		if got := tr.packet(st, side, c.Nodes[side]).String(); got != want {
			t.Errorf("packet on side %d: %s, want %s", side, got, want)
		}
	}
}
