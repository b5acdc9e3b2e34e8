package ruleset

import (
	"slices"

	"sigs.k8s.io/knftables"
)

// addFirewall puts LoadBalancer frontend key of sp behind the source-range
// firewall: the frontend goes into firewall-ips, and each of its
// loadBalancerSourceRanges of this family into firewall-allow as
// frontend . range; firewall-check drops new connections to a firewall-ips
// frontend from any source outside its ranges. When none of the ranges is of this
// family, the frontend has no firewall-allow element and every source is dropped:
// the ranges restrict the Service, and failing open for the other family would
// admit clients the user meant to keep out (kube-proxy, which ignores the ranges
// of the other family, fails open here).
func (b *layout) addFirewall(sp *servicePort, key []string) {
	b.rs.AddElement(&knftables.Element{Set: SetFirewallIPs, Key: slices.Clone(key), Comment: elementComment(sp.id)})
	for _, r := range b.fam.prefixes(sp.svc.SourceRanges) {
		b.rs.AddElement(&knftables.Element{Set: SetFirewallAllow, Key: append(slices.Clone(key), prefixString(r))})
	}
}
