package kernel

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// Port is a transport port the node answers on itself.
type Port struct {
	Proto lab.Proto
	Port  uint16
}

// Place says which namespace of the lab owns an address.
type Place struct {
	// Origin is the kind of namespace: a pod of the node, a pod of the remote node, the
	// node itself, or the external client.
	Origin features.Origin
	// Pod is the pod's name (lab.PodSpec.Name) for pod and remote-pod places.
	Pod string
}

// String describes the place, e.g. "pod 10.1.0.5" or "the external client".
func (p Place) String() string {
	switch p.Origin {
	case features.FromPod:
		return "pod " + p.Pod + " of the node"
	case features.FromRemotePod:
		return "pod " + p.Pod + " of the remote node"
	case features.FromNode:
		return "the node"
	}
	return "the external client"
}

// Topology is the lab a scenario runs in and where each of the scenario's addresses lives
// in it. Derive computes it from the scenario alone.
type Topology struct {
	// Spec builds the lab.
	Spec lab.Spec
	// Places maps every address that sends or answers traffic to the namespace owning it:
	// node addresses and loopback to the node, endpoints to pods of the node (nodeName is
	// the scenario's node) or of the remote node (any other nodeName), packet sources to
	// the namespace their origin names.
	Places map[netip.Addr]Place
	// PodAddrs maps each pod's name to its address (every pod has exactly one).
	PodAddrs map[string]netip.Addr
	// LocalPorts are the ports on which the node answers itself, on LocalAddrs: those of
	// the packets expected to be delivered to the node.
	LocalPorts []Port
	// LocalAddrs are the node's scenario addresses and the loopback addresses.
	LocalAddrs []netip.Addr
	// RemoteSources are the remote-pod client addresses. The remote node routes traffic to
	// them from its other pods through the node, as a pod's own node would undo a Service
	// DNAT: otherwise an endpoint on the remote node would answer such a client directly,
	// past the node's conntrack.
	RemoteSources []netip.Addr
	// Unsupported says why an address of the scenario has no place in the lab.
	Unsupported map[netip.Addr]string
}

// Loopback addresses belong to the node: scenarios send to them "from: node".
var (
	loopback4 = netip.MustParseAddr("127.0.0.1")
	loopback6 = netip.IPv6Loopback()
)

// labLinks are the node's interfaces that are not pod interfaces; a pod interface prefix
// must not match them.
var labLinks = []string{"lo", "eth0", "eth1", "void0", "eth0-peer", "void0-peer"}

// Derive computes the lab topology of a scenario. It reads every step, so that addresses
// that appear only in a later update exist from the start:
//   - the node's addresses go on its eth0, each in a subnet free of the scenario's other
//     addresses; the first of each family also goes on eth1 towards the remote node, so
//     that masquerading shows that address on every link, as the simulator assumes;
//   - every endpoint address is a pod (one address per pod) serving all the ports listed
//     for it, on the node when its nodeName is the scenario's node, else on the remote node;
//   - packet sources are pods, remote pods or addresses of the external client as their
//     origin says; the client gets, for each address outside the node's subnets, a subnet
//     of its own in which the node has a helper address, and an address in the node's first
//     subnet of each family for its default route;
//   - pod interfaces are named with the config's detectLocal.interfaceNamePrefix when it has one.
func Derive(sc *features.Scenario) (*Topology, error) {
	inv, err := takeInventory(sc)
	if err != nil {
		return nil, err
	}
	t := &Topology{
		Places:      map[netip.Addr]Place{},
		PodAddrs:    map[string]netip.Addr{},
		Unsupported: map[netip.Addr]string{},
		LocalPorts:  inv.localPorts,
	}
	prefix := sc.Config.InterfacePrefix
	for _, l := range labLinks {
		if prefix != "" && strings.HasPrefix(l, prefix) {
			return nil, fmt.Errorf("%s: config detectLocal.interfaceNamePrefix %q matches the lab's interface %s", sc.File, prefix, l)
		}
	}
	t.Spec.VethPrefix = prefix

	nodeFamilies := map[bool]bool{}
	for _, a := range sc.Node.Addresses {
		nodeFamilies[a.Is6()] = true
		t.Places[a] = Place{Origin: features.FromNode}
		t.LocalAddrs = append(t.LocalAddrs, a)
	}
	for _, a := range []netip.Addr{loopback4, loopback6} {
		t.Places[a] = Place{Origin: features.FromNode}
		t.LocalAddrs = append(t.LocalAddrs, a)
	}
	place := func(a netip.Addr, o features.Origin) {
		if _, ok := t.Places[a]; ok {
			return // the first place wins; Locate reports packets that disagree
		}
		if _, ok := t.Unsupported[a]; ok {
			return
		}
		if !nodeFamilies[a.Is6()] {
			t.Unsupported[a] = fmt.Sprintf("the node has no %s address to route %s through", familyName(a), a)
			return
		}
		p := Place{Origin: o}
		if o == features.FromPod || o == features.FromRemotePod {
			p.Pod = podName(a)
			t.PodAddrs[p.Pod] = a
		}
		t.Places[a] = p
		if o == features.FromRemotePod && inv.remoteSource[a] {
			t.RemoteSources = append(t.RemoteSources, a)
		}
	}
	for _, a := range inv.order {
		if ep, ok := inv.endpoints[a]; ok {
			o := features.FromRemotePod
			if ep.local {
				o = features.FromPod
			}
			place(a, o)
		}
		if o, ok := inv.sources[a]; ok && o != features.FromNode {
			place(a, o)
		}
	}

	// Pods, in order of appearance.
	var clients []netip.Addr
	for _, a := range inv.order {
		p, ok := t.Places[a]
		if !ok {
			continue
		}
		var ports []uint16
		if ep, ok := inv.endpoints[a]; ok {
			ports = ep.ports
		}
		switch p.Origin {
		case features.FromPod:
			t.Spec.Pods = append(t.Spec.Pods, lab.PodSpec{Name: p.Pod, Addrs: []netip.Addr{a}, Ports: ports})
		case features.FromRemotePod:
			if t.Spec.Remote == nil {
				t.Spec.Remote = &lab.RemoteSpec{}
			}
			r := t.Spec.Remote
			r.Pods = append(r.Pods, lab.PodSpec{Name: p.Pod, Addrs: []netip.Addr{a}, Ports: ports})
			r.PodCIDRs = append(r.PodCIDRs, netip.PrefixFrom(a, a.BitLen()))
		case features.FromExternal:
			clients = append(clients, a)
		}
	}
	if err := t.planSubnets(sc, inv, clients); err != nil {
		return nil, fmt.Errorf("%s: %w", sc.File, err)
	}
	return t, nil
}

// podName names the pod holding address a: the address itself, with 'x' for ':'
// (lab pod names are made of [a-z0-9.-]).
func podName(a netip.Addr) string { return strings.ReplaceAll(a.String(), ":", "x") }

func familyName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// inventory is every address and port a scenario uses, over all its steps.
type inventory struct {
	order        []netip.Addr // every address, in order of first appearance
	seen         map[netip.Addr]bool
	endpoints    map[netip.Addr]*endpointInfo
	sources      map[netip.Addr]features.Origin // first origin of each packet source
	remoteSource map[netip.Addr]bool
	localPorts   []Port
}

type endpointInfo struct {
	local bool
	ports []uint16
}

func (inv *inventory) add(a netip.Addr) {
	if a.IsValid() && !inv.seen[a] {
		inv.seen[a] = true
		inv.order = append(inv.order, a)
	}
}

// takeInventory reads the initial cluster and every step, applying updates and deletions
// to a Tracker of its own.
func takeInventory(sc *features.Scenario) (*inventory, error) {
	inv := &inventory{
		seen:         map[netip.Addr]bool{},
		endpoints:    map[netip.Addr]*endpointInfo{},
		sources:      map[netip.Addr]features.Origin{},
		remoteSource: map[netip.Addr]bool{},
	}
	for _, a := range sc.Node.Addresses {
		inv.add(a)
	}
	t, err := sc.Tracker()
	if err != nil {
		return nil, err
	}
	inv.addState(sc, t.State())
	for _, st := range sc.Steps {
		switch {
		case st.Update != nil:
			if err := sc.Apply(t, *st.Update); err != nil {
				return nil, fmt.Errorf("%s:%d: update: %w", sc.File, st.Line, err)
			}
			inv.addState(sc, t.State())
		case st.Delete != nil:
			features.Delete(t, st.Delete)
		case st.Packet != nil:
			inv.addPacket(st)
		}
	}
	return inv, nil
}

func (inv *inventory) addState(sc *features.Scenario, st *state.ClusterState) {
	for _, name := range sortedServiceNames(st.Services) {
		svc := st.Services[name]
		for _, as := range [][]netip.Addr{svc.ClusterIPs, svc.ExternalIPs, svc.LoadBalancerIPs} {
			for _, a := range as {
				inv.add(a)
			}
		}
	}
	// Slices of deleted Services linger in the state; their endpoints are pods too.
	for _, name := range sortedServiceNames(st.Slices) {
		bySlice := st.Slices[name]
		for _, sn := range slices.Sorted(maps.Keys(bySlice)) {
			sl := bySlice[sn]
			for _, e := range sl.Endpoints {
				inv.add(e.Address)
				info := inv.endpoints[e.Address]
				if info == nil {
					info = &endpointInfo{local: e.NodeName == sc.Node.Name}
					inv.endpoints[e.Address] = info
				}
				for _, p := range sl.Ports {
					if !slices.Contains(info.ports, p.Port) {
						info.ports = append(info.ports, p.Port)
					}
				}
			}
		}
	}
}

func (inv *inventory) addPacket(st *features.Step) {
	p := st.Packet
	src := p.Src.Addr()
	inv.add(src)
	inv.add(p.Dst.Addr())
	if _, ok := inv.sources[src]; !ok {
		inv.sources[src] = st.From
	}
	if st.From == features.FromRemotePod {
		inv.remoteSource[src] = true
	}
	if st.Expect != nil && st.Expect.Local {
		if proto, ok := labProto(p.Protocol); ok {
			port := Port{Proto: proto, Port: p.Dst.Port()}
			if !slices.Contains(inv.localPorts, port) {
				inv.localPorts = append(inv.localPorts, port)
			}
		}
	}
}

// labProto returns the lab's name of a packet protocol, if the lab speaks it.
func labProto(p packet.Protocol) (lab.Proto, bool) {
	switch p {
	case packet.TCP:
		return lab.TCP, true
	case packet.UDP:
		return lab.UDP, true
	case packet.SCTP:
		return lab.SCTP, true
	}
	return "", false
}

// Locate returns the place p is sent from, or an error wrapping features.ErrUnsupported
// that says why the lab cannot send p as the scenario states it.
func (t *Topology) Locate(p packet.Packet, from features.Origin, exp *features.Expect) (Place, error) {
	unsupported := func(format string, args ...any) (Place, error) {
		return Place{}, fmt.Errorf("kernel backend: packet %s from %s: %s: %w", p, from, fmt.Sprintf(format, args...), features.ErrUnsupported)
	}
	src := p.Src.Addr()
	switch {
	case p.CT != packet.CTNew:
		return unsupported("conntrack state %s: the lab only opens new connections", p.CT)
	case p.Mark != 0:
		return unsupported("mark %#x: the lab cannot mark packets before they reach the node", p.Mark)
	case p.OIf != "":
		return unsupported("oif %s: the lab's routing chooses the output interface", p.OIf)
	}
	if _, ok := labProto(p.Protocol); !ok {
		return unsupported("protocol %s: the lab exchanges TCP, UDP and SCTP only", p.Protocol)
	}
	if p.Protocol == packet.SCTP && exp != nil && exp.Local {
		return unsupported("the node's own responder speaks TCP and UDP only")
	}
	if why, ok := t.Unsupported[src]; ok {
		return unsupported("%s", why)
	}
	pl, ok := t.Places[src]
	if !ok {
		return unsupported("source %s is not an address of %s in the lab", src, Place{Origin: from})
	}
	if pl.Origin != from {
		return unsupported("source %s is %s in the lab", src, pl)
	}
	if p.IIf != "" {
		want := map[features.Origin]string{features.FromExternal: "eth0", features.FromRemotePod: "eth1"}[from]
		podIf := from == features.FromPod && strings.HasPrefix(p.IIf, t.vethPrefix())
		if !podIf && p.IIf != want {
			return unsupported("iif %s: in the lab, packets from %s arrive on %s", p.IIf, pl, t.iifName(pl))
		}
	}
	return pl, nil
}

func (t *Topology) vethPrefix() string {
	if t.Spec.VethPrefix == "" {
		return lab.DefaultVethPrefix
	}
	return t.Spec.VethPrefix
}

// iifName describes the interface on which the node receives traffic from pl.
func (t *Topology) iifName(pl Place) string {
	switch pl.Origin {
	case features.FromPod:
		return "the pod's interface " + t.vethPrefix() + "N"
	case features.FromRemotePod:
		return "eth1"
	case features.FromExternal:
		return "eth0"
	}
	return "no interface (they start at the output hook)"
}
