package lab

import (
	"fmt"
	"net/netip"
	"regexp"
)

// DefaultEchoPort is the port the echo servers of a pod listen on when its spec names none.
const DefaultEchoPort = 8080

// DefaultVethPrefix starts the name of the node-side end of each pod's veth.
const DefaultVethPrefix = "veth"

// Spec describes a lab topology. Every address comes from the caller (a scenario); the lab
// only wires them up.
//
// The node has eth0 (NodeAddrs; a veth to the external client, or a veth whose peer stays
// down when there is no client), eth1 to the remote node, one veth per local pod, and a
// default route (both families) into void0, a NOARP veth whose peer is down: it swallows what
// is routed to it after the forward and postrouting hooks, as a default gateway leading
// nowhere would, so that traffic to an address nobody has times out instead of being
// rejected by the lab's own routing.
type Spec struct {
	// NodeAddrs are the node's addresses on eth0, e.g. 192.168.10.1/24 and fd00:10::1/64.
	// The first IPv4 one is the (onlink) IPv4 gateway of the local pods; their IPv6 gateway
	// is fe80::1 on the node's end of their veth. A link-local gateway is never chosen as a
	// source, so masqueraded and node-originated traffic shows the node's eth0 address.
	NodeAddrs []netip.Prefix
	// VethPrefix names the node-side end of pod veths: VethPrefix + index of the pod in
	// Pods (or Remote.Pods on the remote node). Empty means DefaultVethPrefix.
	VethPrefix string
	// Pods run on the node.
	Pods []PodSpec
	// Remote, when set, adds a remote node with pods of its own.
	Remote *RemoteSpec
	// Client, when set, adds an external client on the node's eth0 network.
	Client *ClientSpec
}

// PodSpec describes a pod: a namespace with eth0 holding its addresses (/32 and /128) and
// echo servers on its ports.
type PodSpec struct {
	// Name identifies the pod in echo replies and names its namespace.
	Name string
	// Addrs are the pod's addresses, at most one per family.
	Addrs []netip.Addr
	// Ports are the echo ports (TCP, UDP, and SCTP where the kernel has it). Empty means
	// DefaultEchoPort.
	Ports []uint16
}

// RemoteSpec describes a second node, linked to the node by node eth1 <-> remote eth0.
type RemoteSpec struct {
	// NodeAddrs are the node's addresses on eth1, e.g. 192.168.20.1/24.
	NodeAddrs []netip.Prefix
	// Addrs are the remote node's addresses on its eth0, in the subnets of NodeAddrs. The
	// first IPv4 one is the IPv4 gateway of the remote pods.
	Addrs []netip.Prefix
	// PodCIDRs are routed by the node to the remote node; the remote pods' addresses must
	// lie in them.
	PodCIDRs []netip.Prefix
	// Pods run on the remote node.
	Pods []PodSpec
}

// ClientSpec describes a host outside the cluster on the node's eth0 network.
type ClientSpec struct {
	// Addrs are the client's addresses, in the subnets of Spec.NodeAddrs; its default route
	// leads to the node.
	Addrs []netip.Prefix
}

var podNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,38}[a-z0-9])?$`)

// withDefaults returns a copy of the spec with defaults filled in, or why it cannot be built.
func (s Spec) withDefaults() (Spec, error) {
	if s.VethPrefix == "" {
		s.VethPrefix = DefaultVethPrefix
	}
	npods := len(s.Pods)
	if s.Remote != nil {
		npods = max(npods, len(s.Remote.Pods))
	}
	if len(s.VethPrefix)+len(fmt.Sprint(npods)) > 15 {
		return s, fmt.Errorf("veth prefix %q: interface names would exceed 15 characters", s.VethPrefix)
	}
	if err := checkPrefixes("node eth0", s.NodeAddrs); err != nil {
		return s, err
	}
	names := map[string]bool{}
	fix := func(where string, pods []PodSpec, gw []netip.Prefix, within []netip.Prefix) ([]PodSpec, error) {
		out := make([]PodSpec, len(pods))
		for i, p := range pods {
			if !podNameRE.MatchString(p.Name) {
				return nil, fmt.Errorf("%s pod %q: name must be 1-40 of [a-z0-9.-]", where, p.Name)
			}
			if names[p.Name] {
				return nil, fmt.Errorf("%s pod %s: duplicate name", where, p.Name)
			}
			names[p.Name] = true
			if len(p.Addrs) == 0 {
				return nil, fmt.Errorf("%s pod %s: no address", where, p.Name)
			}
			seen := map[bool]bool{}
			for _, a := range p.Addrs {
				if !a.IsValid() || a.Is4In6() || a.Zone() != "" {
					return nil, fmt.Errorf("%s pod %s: invalid address %v", where, p.Name, a)
				}
				if seen[a.Is6()] {
					return nil, fmt.Errorf("%s pod %s: more than one %s address", where, p.Name, familyName(a))
				}
				seen[a.Is6()] = true
				if a.Is4() && !first(gw, false).IsValid() {
					return nil, fmt.Errorf("%s pod %s: IPv4 address %v but no IPv4 gateway (the node address of that family)", where, p.Name, a)
				}
				if within != nil && !containedIn(a, within) {
					return nil, fmt.Errorf("%s pod %s: address %v outside the pod CIDRs %v", where, p.Name, a, within)
				}
			}
			p.Addrs = append([]netip.Addr(nil), p.Addrs...)
			if len(p.Ports) == 0 {
				p.Ports = []uint16{DefaultEchoPort}
			} else {
				p.Ports = append([]uint16(nil), p.Ports...)
			}
			out[i] = p
		}
		return out, nil
	}
	var err error
	if s.Pods, err = fix("node", s.Pods, s.NodeAddrs, nil); err != nil {
		return s, err
	}
	if s.Client != nil {
		c := *s.Client
		if err := checkPrefixes("client eth0", c.Addrs); err != nil {
			return s, err
		}
		for _, a := range c.Addrs {
			if !sameSubnet(a, s.NodeAddrs) {
				return s, fmt.Errorf("client address %v: not in a subnet of the node's eth0 %v", a, s.NodeAddrs)
			}
		}
		s.Client = &c
	}
	if s.Remote != nil {
		r := *s.Remote
		if err := checkPrefixes("node eth1", r.NodeAddrs); err != nil {
			return s, err
		}
		if err := checkPrefixes("remote eth0", r.Addrs); err != nil {
			return s, err
		}
		for _, a := range r.Addrs {
			if !sameSubnet(a, r.NodeAddrs) {
				return s, fmt.Errorf("remote address %v: not in a subnet of the node's eth1 %v", a, r.NodeAddrs)
			}
		}
		for _, c := range r.PodCIDRs {
			if !c.IsValid() || c != c.Masked() {
				return s, fmt.Errorf("remote pod CIDR %v: invalid or not a network address", c)
			}
			if !first(r.Addrs, c.Addr().Is6()).IsValid() {
				return s, fmt.Errorf("remote pod CIDR %v: the remote node has no %s address", c, familyName(c.Addr()))
			}
		}
		if r.Pods, err = fix("remote", r.Pods, r.Addrs, r.PodCIDRs); err != nil {
			return s, err
		}
		s.Remote = &r
	}
	return s, nil
}

func checkPrefixes(where string, ps []netip.Prefix) error {
	for _, p := range ps {
		if !p.IsValid() || p.Addr().Is4In6() || p.Addr().Zone() != "" || p.Addr() == p.Masked().Addr() {
			return fmt.Errorf("%s address %v: want a host address with its subnet length, e.g. 192.168.10.1/24", where, p)
		}
	}
	return nil
}

// first returns the address of the first prefix of the family, or the zero Addr.
func first(ps []netip.Prefix, v6 bool) netip.Addr {
	for _, p := range ps {
		if p.Addr().Is6() == v6 {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// sameSubnet reports whether p's address lies in one of the subnets of ps.
func sameSubnet(p netip.Prefix, ps []netip.Prefix) bool {
	for _, q := range ps {
		if q.Bits() == p.Bits() && q.Masked() == p.Masked() && q.Addr() != p.Addr() {
			return true
		}
	}
	return false
}

func containedIn(a netip.Addr, cidrs []netip.Prefix) bool {
	for _, c := range cidrs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

func familyName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}
