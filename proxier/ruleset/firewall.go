package ruleset

// addFirewall puts LoadBalancer frontend key of sp behind its source-range firewall
// chain, adding the chain on first use. The chain drops sources outside
// loadBalancerSourceRanges. When none of the ranges is of this family, it drops
// every source: the ranges restrict the Service, and failing open for the other
// family would admit clients the user meant to keep out (kube-proxy, which ignores
// the ranges of the other family, fails open here).
func (b *builder) addFirewall(sp *servicePort, key []string) {
	name := PortChainName(kindFirewall, sp.id)
	if _, ok := b.rs.Chains[name]; !ok {
		rule := "drop"
		if ranges := b.fam.prefixes(sp.svc.SourceRanges); len(ranges) > 0 {
			rule = b.fam.ip + " saddr != " + prefixMatch(ranges) + " drop"
		}
		b.chain(name, rule)
	}
	b.dispatchElement(MapFirewallIPs, key, "goto "+name, sp)
}
