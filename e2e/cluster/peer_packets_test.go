package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/sim"
)

// The packets of the peer conformance suite, each traced on both compared nodes
// translated to the node (its address, its own pods), and the outcome class compared:
// verdicts, the endpoints reached (probabilities ignored) and masquerading.

// The sources of probes, as seen from the node a packet is traced on.
const (
	srcPod      = "pod on this node"
	srcRemote   = "pod on another node"
	srcNode     = "this node"
	srcAllowed  = "external client inside the source ranges"
	srcOutsider = "external client outside the source ranges"
	srcGateway  = "the nodes' gateway"
)

// The destinations of probes.
const (
	dstClusterIP   = "ClusterIP"
	dstWrongPort   = "ClusterIP, a port the Service lacks"
	dstOtherProto  = "ClusterIP, the port with another protocol"
	dstNodePort    = "NodePort on the node's address"
	dstIngress     = "load-balancer IP"
	dstExternalIP  = "external IP"
	dstUnallocated = "unallocated service IP"
	dstOtherNode   = "NodePort on another node's address"
)

// The connections an affinity probe makes: after a first one from the same client went
// to the endpoint whose name sorts first, a second one at once, one just within the
// affinity timeout and one just after it.
const (
	affinityNone = iota
	affinitySecond
	affinityWithin
	affinityExpired
)

var affinityNames = []string{"", ", a second connection", ", a connection within the affinity timeout",
	", a connection after the affinity timeout"}

// The external clients' addresses: 203.0.113.0/25 is in every source range the
// generator draws, 198.51.100.0/24 in none; 2001:db8:7::/64 is in every IPv6 range it
// draws, 2001:db8:9::/64 in none.
var (
	allowedClient   = netip.MustParseAddr("203.0.113.7")
	outsiderClient  = netip.MustParseAddr("198.51.100.9")
	allowedClient6  = netip.MustParseAddr("2001:db8:7::7")
	outsiderClient6 = netip.MustParseAddr("2001:db8:9::9")
)

// probe is one packet, told abstractly: it becomes a concrete packet on each node.
type probe struct {
	svc  *v1.Service // nil for the unallocated address
	port v1.ServicePort
	src  string
	// pod is the source pod, for srcPod an index of the twins, for srcRemote of the
	// others.
	pod int
	// srcName is the source's canonical name (peerView.name) on either node.
	srcName string
	dst     string
	// affinity is the connection of an affinity probe (affinitySecond, ...).
	affinity int
	addr     netip.Addr // the destination, unless it is the node's own (NodePort)
	dport    uint16
	proto    packet.Protocol
	// six says the probe is IPv6: its source and a node's address are then IPv6.
	six bool
}

func (pr probe) String() string {
	svc := "no Service"
	if pr.svc != nil {
		svc = fmt.Sprintf("service %s port %s (%s)", pr.svc.Name, pr.port.Name, describeService(pr.svc))
	}
	fam := ""
	if pr.six {
		fam = " over IPv6"
	}
	return fmt.Sprintf("%s from %s (%s) to %s%s%s", svc, pr.src, pr.srcName, pr.dst, affinityNames[pr.affinity], fam)
}

// describeService says what sets a Service apart, for messages.
func describeService(svc *v1.Service) string {
	s := svc.Spec
	parts := []string{string(s.Type), fmt.Sprint(s.Selector)}
	if s.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
		parts = append(parts, "eTP Local")
	}
	if s.InternalTrafficPolicy != nil && *s.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal {
		parts = append(parts, "iTP Local")
	}
	if s.SessionAffinity == v1.ServiceAffinityClientIP {
		parts = append(parts, "affinity")
	}
	if s.TrafficDistribution != nil {
		parts = append(parts, *s.TrafficDistribution)
	}
	if len(s.LoadBalancerSourceRanges) > 0 {
		parts = append(parts, fmt.Sprint("ranges ", s.LoadBalancerSourceRanges))
	}
	if s.PublishNotReadyAddresses {
		parts = append(parts, "publishNotReady")
	}
	if len(s.ExternalIPs) > 0 {
		parts = append(parts, fmt.Sprint("externalIPs ", s.ExternalIPs))
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		mode := "VIP"
		if ing.IPMode != nil {
			mode = string(*ing.IPMode)
		}
		parts = append(parts, "ingress "+ing.IP+" "+mode)
	}
	return strings.Join(parts, ", ")
}

var protocols = map[v1.Protocol]packet.Protocol{v1.ProtocolTCP: packet.TCP, v1.ProtocolUDP: packet.UDP, v1.ProtocolSCTP: packet.SCTP}

// probes returns every probe of an applied set: each destination of each Service port
// over each of its families from every source of the family. other is a node that is
// not compared.
func (ap *applied) probes(other *Node) []probe {
	var dsts []probe
	for _, tmpl := range ap.set.services {
		svc := ap.services[tmpl.Name]
		for _, ip := range svc.Spec.ClusterIPs {
			dsts = append(dsts, ap.serviceProbes(svc, netip.MustParseAddr(ip), other)...)
		}
	}
	dsts = append(dsts, probe{dst: dstUnallocated, addr: ap.set.unallocated, dport: 80, proto: packet.TCP})
	if ap.set.unallocated6.IsValid() {
		dsts = append(dsts, probe{dst: dstUnallocated, addr: ap.set.unallocated6, dport: 80, proto: packet.TCP, six: true})
	}
	var out []probe
	for _, d := range dsts {
		for i, tw := range ap.set.twins {
			out = append(out, d.from(srcPod, i, tw.name+"@here"))
		}
		for i, o := range ap.set.others {
			out = append(out, d.from(srcRemote, i, o.name))
		}
		allowed, outsider := allowedClient, outsiderClient
		if d.six {
			allowed, outsider = allowedClient6, outsiderClient6
		}
		out = append(out, d.from(srcNode, 0, "this node"), d.from(srcAllowed, 0, allowed.String()),
			d.from(srcOutsider, 0, outsider.String()), d.from(srcGateway, 0, "node "+gatewayName))
	}
	return out
}

// serviceProbes returns the destinations of a Service over the family of its ClusterIP
// ip: each of its ports at the ClusterIP, a port it lacks, the other protocol, the node
// ports on this node and other, and its load-balancer and external IPs of the family.
func (ap *applied) serviceProbes(svc *v1.Service, ip netip.Addr, other *Node) []probe {
	var dsts []probe
	six := ip.Is6()
	otherAddr := nodeAddr(other, ip)
	for _, sp := range svc.Spec.Ports {
		proto := protocols[sp.Protocol]
		affinity := svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP
		at := func(dst string, addr netip.Addr, port int32, proto packet.Protocol) {
			pr := probe{svc: svc, port: sp, dst: dst, addr: addr, dport: uint16(port), proto: proto, six: six}
			dsts = append(dsts, pr)
			if affinity && dst != dstWrongPort && dst != dstOtherProto && dst != dstOtherNode {
				for a := affinitySecond; a <= affinityExpired; a++ {
					pr.affinity = a
					dsts = append(dsts, pr)
				}
			}
		}
		at(dstClusterIP, ip, sp.Port, proto)
		at(dstWrongPort, ip, 7, proto)
		if other := otherProtocol(svc, sp); other != 0 {
			at(dstOtherProto, ip, sp.Port, other)
		}
		if sp.NodePort != 0 {
			at(dstNodePort, netip.Addr{}, sp.NodePort, proto)
			at(dstOtherNode, otherAddr, sp.NodePort, proto)
		}
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if a := netip.MustParseAddr(ing.IP); a.Is6() == six {
				at(dstIngress, a, sp.Port, proto)
			}
		}
		for _, e := range svc.Spec.ExternalIPs {
			if a := netip.MustParseAddr(e); a.Is6() == six {
				at(dstExternalIP, a, sp.Port, proto)
			}
		}
	}
	return dsts
}

func (pr probe) from(src string, pod int, name string) probe {
	pr.src, pr.pod, pr.srcName = src, pod, name
	return pr
}

// otherProtocol is a protocol of the port's number that the Service does not serve on
// it, or 0.
func otherProtocol(svc *v1.Service, sp v1.ServicePort) packet.Protocol {
	for _, p := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
		if !slices.ContainsFunc(svc.Spec.Ports, func(q v1.ServicePort) bool { return q.Port == sp.Port && q.Protocol == p }) {
			return protocols[p]
		}
	}
	return 0
}

// peerView is a compared node with its traced ruleset: side 0 is node a, 1 node b.
type peerView struct {
	node *Node
	side int
	ap   *applied
	prog *sim.Program
	text string // the ruleset as listed
	env  sim.Env
	// names are the canonical names of addresses: a twin's pod on this node and on the
	// other compared node are its name with "@here" and "@peer" on both nodes.
	names map[netip.Addr]string
	// peerCIDR is the other compared node's pod CIDR: pods without a name are named by
	// their host number and node; peerCIDR6 its IPv6 one in a dual-stack lab.
	peerCIDR, peerCIDR6 netip.Prefix
	// gateway is the nodes' gateway, a client on their network; gateway6 its IPv6
	// address in a dual-stack lab.
	gateway, gateway6 netip.Addr
}

// gatewayName is the name of the nodes' gateway.
const gatewayName = "gateway"

func newPeerView(ctx context.Context, n *Node, side int, ap *applied, c *Cluster) (*peerView, error) {
	v, err := liveView(ctx, n, side, c)
	if err != nil {
		return nil, err
	}
	v.ap = ap
	// A pod's IPv6 address has its name too: a packet keeps its family.
	for i, pair := range ap.twins {
		for _, a := range pair[side].Addrs() {
			v.names[a] = ap.set.twins[i].name + "@here"
		}
		for _, a := range pair[1-side].Addrs() {
			v.names[a] = ap.set.twins[i].name + "@peer"
		}
	}
	for _, p := range ap.others {
		for _, a := range p.Addrs() {
			v.names[a] = p.Spec.Name
		}
	}
	return v, nil
}

// liveView compiles the live ruleset of n, the compared node of side side, and names
// the cluster's nodes and their pod gateways.
func liveView(ctx context.Context, n *Node, side int, c *Cluster) (*peerView, error) {
	v := &peerView{node: n, side: side, names: map[netip.Addr]string{}}
	var err error
	if v.prog, v.text, err = n.LiveProgram(ctx); err != nil {
		return nil, err
	}
	if v.env, err = n.SimEnv(); err != nil {
		return nil, err
	}
	for _, m := range c.Nodes {
		v.names[m.Addr] = "node " + m.Spec.Name
		v.names[m.PodCIDR.Addr().Next()] = "pod gateway of " + m.Spec.Name
		if m.Addr6.IsValid() {
			v.names[m.Addr6] = "node " + m.Spec.Name
			v.names[m.PodCIDR6.Addr().Next()] = "pod gateway of " + m.Spec.Name
		}
	}
	v.names[n.Addr] = "this node"
	v.names[n.PodCIDR.Addr().Next()] = "this node's pod gateway"
	peer := c.Node(comparedNodes[1-side])
	v.peerCIDR = peer.PodCIDR
	v.gateway = c.Spec.Gateway
	v.names[c.Spec.Gateway] = "node " + gatewayName
	if c.Spec.DualStack {
		v.names[n.Addr6] = "this node"
		v.names[n.PodCIDR6.Addr().Next()] = "this node's pod gateway"
		v.peerCIDR6, v.gateway6 = peer.PodCIDR6, c.Spec.addr6(c.Spec.Gateway)
		v.names[v.gateway6] = "node " + gatewayName
	}
	return v, nil
}

// packet is the probe on this node.
func (v *peerView) packet(pr probe, sport uint16) packet.Packet {
	p := packet.Packet{Protocol: pr.proto, Dst: netip.AddrPortFrom(pr.addr, pr.dport)}
	// pick is the address of the probe's family.
	pick := func(a4, a6 netip.Addr) netip.Addr {
		if pr.six {
			return a6
		}
		return a4
	}
	if pr.dst == dstNodePort {
		p.Dst = netip.AddrPortFrom(pick(v.node.Addr, v.node.Addr6), pr.dport)
	}
	var src netip.Addr
	switch pr.src {
	case srcPod:
		pod := v.ap.twins[pr.pod][v.side]
		src, p.IIf = pick(pod.Addr, pod.Addr6), pod.HostVeth
	case srcRemote:
		pod := v.ap.others[pr.pod]
		src, p.IIf = pick(pod.Addr, pod.Addr6), "eth0"
	case srcNode:
		src = pick(v.node.Addr, v.node.Addr6)
	case srcAllowed:
		src, p.IIf = pick(allowedClient, allowedClient6), "eth0"
	case srcOutsider:
		src, p.IIf = pick(outsiderClient, outsiderClient6), "eth0"
	case srcGateway:
		src, p.IIf = pick(v.gateway, v.gateway6), "eth0"
	}
	p.Src = netip.AddrPortFrom(src, sport)
	return p
}

// name is the canonical name of an address.
func (v *peerView) name(a netip.Addr) string {
	if n, ok := v.names[a]; ok {
		return n
	}
	switch {
	case v.node.PodCIDR.Contains(a) || v.node.PodCIDR6.Contains(a):
		return fmt.Sprintf("pod %s.%d@here", family(a), a.As16()[15])
	case v.peerCIDR.Contains(a) || v.peerCIDR6.Contains(a):
		return fmt.Sprintf("pod %s.%d@peer", family(a), a.As16()[15])
	}
	return a.String()
}

// family is "" for an IPv4 address and "v6" for an IPv6 one: canonical names keep the
// family, so that an endpoint reached over the other family is a difference.
func family(a netip.Addr) string {
	if a.Is6() {
		return "v6"
	}
	return ""
}

// outcome traces the probe and returns its outcome class: the distinct outcomes of its
// branches, sorted. An affinity probe traces a first connection, committing the branch
// to the endpoint whose name sorts first, then the probe's own from another port, as
// much later as its affinity says.
func (v *peerView) outcome(pr probe) (string, error) {
	if pr.affinity == affinityNone {
		return v.classOf(v.packet(pr, 40000))
	}
	env := v.env
	clock := sim.NewManualClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	env.Clock = clock
	env.Select = func(tr *sim.Trace) int {
		best := 0
		for i, b := range tr.Branches {
			if v.branch(b) < v.branch(tr.Branches[best]) {
				best = i
			}
		}
		return best
	}
	rt := sim.NewRuntime(v.prog, env)
	if _, err := rt.Trace(v.packet(pr, 40000)); err != nil {
		return "", err
	}
	timeout := time.Duration(*pr.svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds) * time.Second
	switch pr.affinity {
	case affinityWithin:
		clock.Advance(timeout - time.Second)
	case affinityExpired:
		clock.Advance(timeout + time.Second)
	}
	tr, err := rt.Trace(v.packet(pr, 40001))
	if err != nil {
		return "", err
	}
	return v.class(tr), nil
}

// classOf traces p from a fresh state and returns its outcome class.
func (v *peerView) classOf(p packet.Packet) (string, error) {
	tr, err := v.prog.Trace(p, v.env)
	if err != nil {
		return "", err
	}
	return v.class(tr), nil
}

func (v *peerView) class(tr *sim.Trace) string {
	var out []string
	for _, b := range tr.Branches {
		if s := v.branch(b); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return strings.Join(out, " | ")
}

// branch is the outcome of one branch: the verdict and, when accepted, where the packet
// went (as a canonical name) and whether its source was translated.
func (v *peerView) branch(b *sim.Branch) string {
	o := b.Outcome
	s := o.Verdict.String()
	if o.Verdict == sim.VerdictAccept {
		s = fmt.Sprintf("accept %s to %s:%d", o.Delivery, v.name(o.Packet.Dst.Addr()), o.Packet.Dst.Port())
		if o.Masquerade || o.SNAT {
			s += " masqueraded"
		}
	}
	if a := b.Assumptions(); len(a) > 0 {
		s += " assuming " + strings.Join(a, "; ")
	}
	return s
}
