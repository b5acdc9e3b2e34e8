package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/packet"
)

// The real side of the feature replay (peer_real_test.go): pod namespaces at the
// addresses the translator gives endpoints and pod sources, echo servers on the ports
// their EndpointSlices name, and the clients that send a scenario packet for real.

// realWorld is what the real replay made in the cluster besides the API objects.
type realWorld struct {
	c *Cluster
	// pods are the pod namespaces by address; a pod is made at the first address that
	// needs one (an endpoint or a pod source), behind the node whose pod CIDR holds it.
	pods map[netip.Addr]*lab.NS
	// served are the echo ports already served at an address (a pod's or a node's).
	served  map[netip.Addr]map[lab.EchoPort]bool
	echoes  []*lab.EchoServer
	extSrcs map[netip.Addr]bool // the external sources added to the external namespace
	ports   atomic.Uint32       // the client source ports used (sourcePort)
}

func newRealWorld(c *Cluster) *realWorld {
	return &realWorld{c: c, pods: map[netip.Addr]*lab.NS{}, served: map[netip.Addr]map[lab.EchoPort]bool{},
		extSrcs: map[netip.Addr]bool{}}
}

// stop stops the echo servers; the namespaces go with the cluster.
func (w *realWorld) stop() error {
	var errs []error
	for _, e := range w.echoes {
		errs = append(errs, e.Stop())
	}
	return errors.Join(errs...)
}

// nodeOf returns the node whose pod CIDR (of either family) holds a, or nil.
func (w *realWorld) nodeOf(a netip.Addr) *Node {
	for _, n := range w.c.Nodes {
		if n.PodCIDR.Contains(a) || n.PodCIDR6.Contains(a) {
			return n
		}
	}
	return nil
}

// pod returns the pod namespace at a, wiring it behind its node as AddPod does (without
// an API object: the replay's slices are selector-less).
func (w *realWorld) pod(a netip.Addr) (*lab.NS, error) {
	if ns := w.pods[a]; ns != nil {
		return ns, nil
	}
	n := w.nodeOf(a)
	if n == nil {
		return nil, fmt.Errorf("pod %s: in no node's pod CIDR", a)
	}
	b := a.As16()
	name, veth := fmt.Sprintf("real-%d-%d", b[14], b[15]), fmt.Sprintf("vreal%d", b[15])
	gw := n.PodCIDR.Addr().Next()
	if a.Is6() {
		name, veth = fmt.Sprintf("real6-%d-%d", b[7], b[15]), fmt.Sprintf("vreal6-%d", b[15])
		gw = n.PodCIDR6.Addr().Next()
	}
	ns, err := w.c.newNS(name, nil)
	if err != nil {
		return nil, err
	}
	w.pods[a] = ns
	if err := addVeth(n.NS, veth, ns, "eth0"); err != nil {
		return nil, fmt.Errorf("pod %s: %w", a, err)
	}
	if err := wireAddr(n.NS, veth, ns, a, gw); err != nil {
		return nil, fmt.Errorf("pod %s: %w", a, err)
	}
	return ns, nil
}

// serve makes an echo server answer at a on ports (TCP and UDP ones), in a's pod or, for
// a node's address (a host-network endpoint), in the node; it answers with a's address.
func (w *realWorld) serve(a netip.Addr, ports []lab.EchoPort) error {
	var ns *lab.NS
	for _, n := range w.c.Nodes {
		if n.Addr == a || n.Addr6 == a {
			ns = n.NS
		}
	}
	if ns == nil {
		var err error
		if ns, err = w.pod(a); err != nil {
			return err
		}
	}
	if w.served[a] == nil {
		w.served[a] = map[lab.EchoPort]bool{}
	}
	var fresh []lab.EchoPort
	for _, p := range ports {
		if !w.served[a][p] {
			w.served[a][p] = true
			fresh = append(fresh, p)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	e, err := lab.StartEcho(ns, a.String(), []netip.Addr{a}, fresh)
	if err != nil {
		return fmt.Errorf("echo at %s: %w", a, err)
	}
	w.echoes = append(w.echoes, e)
	return nil
}

// syncEndpoints makes every endpoint of the replay's EndpointSlices real: an echo
// server at its address on each TCP and UDP port of its slice.
func (w *realWorld) syncEndpoints(ctx context.Context) error {
	list, err := w.c.Client.DiscoveryV1().EndpointSlices("default").List(ctx,
		metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + peerManagedBy})
	if err != nil {
		return fmt.Errorf("list the replay's endpointslices: %w", err)
	}
	var errs []error
	for _, s := range list.Items {
		var ports []lab.EchoPort
		for _, p := range s.Ports {
			proto := lab.TCP // the API's default
			if p.Protocol != nil {
				proto = lab.Proto(strings.ToLower(string(*p.Protocol)))
			}
			if p.Port != nil && (proto == lab.TCP || proto == lab.UDP) {
				ports = append(ports, lab.EchoPort{Proto: proto, Port: uint16(*p.Port)})
			}
		}
		for _, ep := range s.Endpoints {
			for _, addr := range ep.Addresses {
				if a, err := netip.ParseAddr(addr); err == nil && len(ports) > 0 {
					errs = append(errs, w.serve(a, ports))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// realClient is where a packet is sent from: a namespace, and the address its socket
// binds (zero: the kernel's choice).
type realClient struct {
	ns  *lab.NS
	src netip.Addr
}

// client returns the client of a scenario packet translated to the compared node n, or
// why it cannot be sent for real.
func (w *realWorld) client(from features.Origin, p packet.Packet, n *Node) (realClient, string, error) {
	if p.Protocol != packet.TCP && p.Protocol != packet.UDP {
		return realClient{}, fmt.Sprintf("%s: the echo clients speak TCP and UDP", p.Protocol), nil
	}
	src := p.Src.Addr()
	switch from {
	case features.FromPod, features.FromRemotePod:
		ns, err := w.pod(src)
		return realClient{ns: ns, src: src}, "", err
	case features.FromNode:
		return realClient{ns: n.NS, src: nodeAddr(n, src)}, "", nil
	case features.FromExternal:
		s := w.c.Spec
		if src == s.Gateway || s.DualStack && src == s.addr6(s.Gateway) {
			return realClient{ns: w.c.External, src: src}, "", nil
		}
		if src.Is6() && !s.DualStack {
			return realClient{}, "IPv6 (the lab is IPv4 only)", nil
		}
		lab := []netip.Prefix{s.Segment, s.ClusterCIDR, s.ServiceCIDR, s.Segment6, s.ClusterCIDR6, s.ServiceCIDR6}
		if slices.ContainsFunc(lab, func(p netip.Prefix) bool { return p.Contains(src) }) {
			return realClient{}, "an external source inside the lab's own networks", nil
		}
		if !w.extSrcs[src] {
			if err := addAddr(w.c.External, "lo", netip.PrefixFrom(src, src.BitLen())); err != nil {
				return realClient{}, "", err
			}
			w.extSrcs[src] = true
		}
		return realClient{ns: w.c.External, src: src}, "", nil
	}
	return realClient{}, fmt.Sprintf("packets from %q", from), nil
}

// routeVia points the clients that are not on a compared node at the compared node n:
// node-c's traffic to Service addresses, and all the external namespace's traffic off
// the segment (Service, external and load-balancer addresses, pod addresses).
func (w *realWorld) routeVia(n *Node) error {
	other := w.c.Node(otherNode)
	routes := []struct {
		ns  *lab.NS
		dst netip.Prefix
	}{
		{other.NS, w.c.Spec.ServiceCIDR},
		{other.NS, netip.MustParsePrefix("100.65.0.0/16")}, // the translator's other Service addresses
		{w.c.External, netip.MustParsePrefix("0.0.0.0/0")},
	}
	if w.c.Spec.DualStack {
		routes = append(routes, []struct {
			ns  *lab.NS
			dst netip.Prefix
		}{
			{other.NS, w.c.Spec.ServiceCIDR6},
			{other.NS, otherServices6},
			{w.c.External, netip.MustParsePrefix("::/0")},
		}...)
	}
	for _, r := range routes {
		err := r.ns.Do(func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(r.dst),
				Gw: net.IP(nodeAddr(n, r.dst.Addr()).AsSlice()), Flags: int(netlink.FLAG_ONLINK)})
		})
		if err != nil {
			return fmt.Errorf("netns %s: route %s via %s: %w", r.ns, r.dst, n.Spec.Name, err)
		}
	}
	return nil
}
