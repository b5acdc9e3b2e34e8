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
// generator draws, 198.51.100.0/24 in none.
var (
	allowedClient  = netip.MustParseAddr("203.0.113.7")
	outsiderClient = netip.MustParseAddr("198.51.100.9")
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
}

func (pr probe) String() string {
	svc := "no Service"
	if pr.svc != nil {
		svc = fmt.Sprintf("service %s port %s (%s)", pr.svc.Name, pr.port.Name, describeService(pr.svc))
	}
	return fmt.Sprintf("%s from %s (%s) to %s%s", svc, pr.src, pr.srcName, pr.dst, affinityNames[pr.affinity])
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
// from every source. other is the address of a node that is not compared.
func (ap *applied) probes(other netip.Addr) []probe {
	var dsts []probe
	for _, tmpl := range ap.set.services {
		svc := ap.services[tmpl.Name]
		ip := netip.MustParseAddr(svc.Spec.ClusterIP)
		for _, sp := range svc.Spec.Ports {
			proto := protocols[sp.Protocol]
			affinity := svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP
			at := func(dst string, addr netip.Addr, port int32, proto packet.Protocol) {
				pr := probe{svc: svc, port: sp, dst: dst, addr: addr, dport: uint16(port), proto: proto}
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
				at(dstOtherNode, other, sp.NodePort, proto)
			}
			for _, ing := range svc.Status.LoadBalancer.Ingress {
				at(dstIngress, netip.MustParseAddr(ing.IP), sp.Port, proto)
			}
			for _, e := range svc.Spec.ExternalIPs {
				at(dstExternalIP, netip.MustParseAddr(e), sp.Port, proto)
			}
		}
	}
	dsts = append(dsts, probe{dst: dstUnallocated, addr: ap.set.unallocated, dport: 80, proto: packet.TCP})
	var out []probe
	for _, d := range dsts {
		for i, tw := range ap.set.twins {
			out = append(out, d.from(srcPod, i, tw.name+"@here"))
		}
		for i, o := range ap.set.others {
			out = append(out, d.from(srcRemote, i, o.name))
		}
		out = append(out, d.from(srcNode, 0, "this node"), d.from(srcAllowed, 0, allowedClient.String()),
			d.from(srcOutsider, 0, outsiderClient.String()), d.from(srcGateway, 0, "node "+gatewayName))
	}
	return out
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
	// their host number and node.
	peerCIDR netip.Prefix
	// gateway is the nodes' gateway, a client on their network.
	gateway netip.Addr
}

// gatewayName is the name of the nodes' gateway.
const gatewayName = "gateway"

func newPeerView(ctx context.Context, n *Node, side int, ap *applied, c *Cluster) (*peerView, error) {
	v, err := liveView(ctx, n, side, c)
	if err != nil {
		return nil, err
	}
	v.ap = ap
	for i, pair := range ap.twins {
		v.names[pair[side].Addr] = ap.set.twins[i].name + "@here"
		v.names[pair[1-side].Addr] = ap.set.twins[i].name + "@peer"
	}
	for _, p := range ap.others {
		v.names[p.Addr] = p.Spec.Name
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
	}
	v.names[n.Addr] = "this node"
	v.names[n.PodCIDR.Addr().Next()] = "this node's pod gateway"
	v.peerCIDR = c.Node(comparedNodes[1-side]).PodCIDR
	v.gateway = c.Spec.Gateway
	v.names[c.Spec.Gateway] = "node " + gatewayName
	return v, nil
}

// packet is the probe on this node.
func (v *peerView) packet(pr probe, sport uint16) packet.Packet {
	p := packet.Packet{Protocol: pr.proto, Dst: netip.AddrPortFrom(pr.addr, pr.dport)}
	if pr.dst == dstNodePort {
		p.Dst = netip.AddrPortFrom(v.node.Addr, pr.dport)
	}
	var src netip.Addr
	switch pr.src {
	case srcPod:
		pod := v.ap.twins[pr.pod][v.side]
		src, p.IIf = pod.Addr, pod.HostVeth
	case srcRemote:
		src, p.IIf = v.ap.others[pr.pod].Addr, "eth0"
	case srcNode:
		src = v.node.Addr
	case srcAllowed:
		src, p.IIf = allowedClient, "eth0"
	case srcOutsider:
		src, p.IIf = outsiderClient, "eth0"
	case srcGateway:
		src, p.IIf = v.gateway, "eth0"
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
	case v.node.PodCIDR.Contains(a):
		return fmt.Sprintf("pod .%d@here", a.As4()[3])
	case v.peerCIDR.Contains(a):
		return fmt.Sprintf("pod .%d@peer", a.As4()[3])
	}
	return a.String()
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
