package ruleset

import (
	"net/netip"
	"slices"
)

// addFirewall puts LoadBalancer frontend key of sp behind the source-range
// firewall: the frontend goes into firewall-ips, and each source it allows into
// firewall-allow as frontend . range; firewall-check drops new connections to a
// firewall-ips frontend from any other source (see allowedSources). When no
// source of this family is allowed, the frontend has no firewall-allow element and
// every source is dropped: the ranges restrict the Service, and failing open for
// the other family would admit clients the user meant to keep out (kube-proxy,
// which ignores the ranges of the other family, fails open here).
func (b *layout) addFirewall(sp *servicePort, key []string) {
	keyText := JoinFields(key)
	b.rs.AddElement(SetFirewallIPs, keyText, Elem{Data: elementComment(sp.id)})
	for _, r := range b.allowedSources(sp.svc.SourceRanges, sp.svc.LoadBalancerIPs) {
		b.rs.AddElement(SetFirewallAllow, keyText+" . "+prefixString(r), Elem{})
	}
}

// allowedSources returns the sources of this family a Service with source ranges
// ranges and load-balancer IPs lbIPs admits to its load-balancer frontends: the
// ranges, and, as kube-proxy does, the Service's own load-balancer IPs when some
// range holds the node's primary IP. A load balancer whose VIP is a local address of
// the nodes delivers the node's own requests to the VIP locally, with the VIP as
// their source; admitting the node admits them. The result is masked, sorted and
// has no overlaps (an interval set refuses them).
func (b *layout) allowedSources(ranges []netip.Prefix, lbIPs []netip.Addr) []netip.Prefix {
	own := b.fam.prefixes(ranges)
	nodeIP := b.node.PrimaryIP(b.fam.v6)
	if !nodeIP.IsValid() || !slices.ContainsFunc(own, func(r netip.Prefix) bool { return r.Contains(nodeIP) }) {
		return own
	}
	for _, a := range b.fam.addrs(lbIPs) {
		own = append(own, netip.PrefixFrom(a, a.BitLen()))
	}
	return b.fam.prefixes(own)
}
