package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// The dual-stack lab: with Spec.DualStack every namespace on the segment gets an IPv6
// address beside its IPv4 one, the API server allocates ClusterIPs of both families, the
// controller manager's node IPAM gives every node a pod CIDR of each family (as
// --allocate-node-cidrs does in kubeadm clusters), pods get an address of each, and both
// proxies run dual-stack.

// router6Sysctls make a dual-stack node forward IPv6 and answer rejects without rate
// limit, as routerSysctls do for IPv4.
var router6Sysctls = [][2]string{
	{"net.ipv6.conf.all.forwarding", "1"},
	{"net.ipv6.icmp.ratelimit", "0"},
}

// dualDefaults sets the IPv6 defaults of a dual-stack spec and checks its prefixes.
func (s *Spec) dualDefaults() error {
	if !s.Segment6.IsValid() {
		s.Segment6 = netip.MustParsePrefix("fd00:192:168:80::/64")
	}
	if !s.ClusterCIDR6.IsValid() {
		s.ClusterCIDR6 = netip.MustParsePrefix("fd00:10:80::/48")
	}
	if !s.ServiceCIDR6.IsValid() {
		s.ServiceCIDR6 = netip.MustParsePrefix("fd00:172:30::/112")
	}
	for _, p := range []netip.Prefix{s.Segment6, s.ClusterCIDR6, s.ServiceCIDR6} {
		if !p.Addr().Is6() || p.Addr().Is4In6() {
			return fmt.Errorf("%s: want an IPv6 prefix", p)
		}
	}
	// The node IPAM splits the cluster CIDR into at most 2^16 pod CIDRs of /64.
	if b := s.ClusterCIDR6.Bits(); b < 48 || b > 64 {
		return fmt.Errorf("IPv6 cluster CIDR %s: want /48 to /64", s.ClusterCIDR6)
	}
	return nil
}

// ClusterCIDRs returns the cluster CIDRs as the components' flags take them: the IPv4
// one, then the IPv6 one in a dual-stack lab, comma-separated.
func (s *Spec) ClusterCIDRs() string {
	if s.DualStack {
		return s.ClusterCIDR.String() + "," + s.ClusterCIDR6.String()
	}
	return s.ClusterCIDR.String()
}

// ServiceCIDRs returns the service CIDRs as ClusterCIDRs does the cluster CIDRs.
func (s *Spec) ServiceCIDRs() string {
	if s.DualStack {
		return s.ServiceCIDR.String() + "," + s.ServiceCIDR6.String()
	}
	return s.ServiceCIDR.String()
}

// addr6 is the IPv6 address of the segment whose last group reads as the last byte of
// the IPv4 address a does in decimal (192.168.80.11 is fd00:192:168:80::11), so that
// both addresses of a namespace are easy to tell apart and to pair.
func (s *Spec) addr6(a netip.Addr) netip.Addr {
	base := s.Segment6.Masked().Addr().As16()
	v := 0
	for _, d := range fmt.Sprint(a.As4()[3]) {
		v = v<<4 | int(d-'0')
	}
	base[14], base[15] = byte(v>>8), byte(v)
	return netip.AddrFrom16(base)
}

// plug6 gives ns, plugged into the segment at the IPv4 address addr, its IPv6 address
// and returns it.
func (c *Cluster) plug6(ns *lab.NS, addr netip.Addr) (netip.Addr, error) {
	a := c.Spec.addr6(addr)
	return a, addAddr(ns, "eth0", netip.PrefixFrom(a, c.Spec.Segment6.Bits()))
}

// podCIDRsOf waits until the node IPAM has given node n its pod CIDRs of both families
// and records them in n.
func (c *Cluster) podCIDRsOf(ctx context.Context, n *Node) error {
	var got []string
	return waitFor(ctx, defaultWait, "pod CIDRs of node "+n.Spec.Name, func() (bool, error) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Spec.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if got = node.Spec.PodCIDRs; len(got) < 2 {
			return false, fmt.Errorf("node %s has pod CIDRs %v", n.Spec.Name, got)
		}
		for _, s := range got {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return false, fmt.Errorf("node %s: pod CIDR %q: %w", n.Spec.Name, s, err)
			}
			if p.Addr().Is4() {
				n.PodCIDR = p
			} else {
				n.PodCIDR6 = p
			}
		}
		return n.PodCIDR.IsValid() && n.PodCIDR6.IsValid(), nil
	})
}

// nodeIPAMFlags are kube-controller-manager's flags of the node IPAM of a dual-stack
// lab: pod CIDRs of /24 and /64 from the cluster CIDRs, beside the service CIDRs.
func (s *Spec) nodeIPAMFlags() []string {
	if !s.DualStack {
		return nil
	}
	return []string{"--allocate-node-cidrs=true", "--cidr-allocator-type=RangeAllocator",
		"--cluster-cidr=" + s.ClusterCIDRs(), "--service-cluster-ip-range=" + s.ServiceCIDRs(),
		"--node-cidr-mask-size-ipv4=24", "--node-cidr-mask-size-ipv6=64"}
}

// controllers are the controller manager's controllers: the EndpointSlice controllers
// make the slices, the serviceaccount controller each namespace's default ServiceAccount
// (without which Pods are refused), and in a dual-stack lab the node IPAM the pod CIDRs.
func (s *Spec) controllers() string {
	c := []string{"endpointslice", "endpointslicemirroring", "serviceaccount"}
	if s.DualStack {
		c = append(c, "nodeipam")
	}
	return "--controllers=" + strings.Join(c, ",")
}
