package ruleset

import (
	"fmt"
	"strconv"
)

// podTraffic returns the match that tells this family's pod traffic apart, negated
// when not is set, and false when the configuration has no detector for the family
// (no local mode, ClusterCIDR mode without a cluster CIDR of this family, NodeCIDR
// mode while the Node has no pod CIDR of this family).
func (b *layout) podTraffic(not bool) (string, bool) {
	op := ""
	if not {
		op = "!= "
	}
	switch b.cfg.LocalMode {
	case LocalClusterCIDR:
		cidrs := b.fam.prefixes(b.cfg.ClusterCIDRs)
		if len(cidrs) == 0 {
			return "", false
		}
		return b.fam.ip + " saddr " + op + prefixMatch(cidrs), true
	case LocalNodeCIDR:
		cidrs := b.fam.prefixes(b.node.PodCIDRs)
		if len(cidrs) == 0 {
			return "", false
		}
		return b.fam.ip + " saddr " + op + prefixMatch(cidrs), true
	case LocalInterfacePrefix:
		return "iifname " + op + strconv.Quote(b.cfg.InterfacePrefix+"*"), true
	case LocalBridgeInterface:
		return "iifname " + op + strconv.Quote(b.cfg.BridgeInterface), true
	}
	return "", false
}

// masqMark returns the packet mark bit that requests masquerading, as nft spells it.
func (b *layout) masqMark() string { return fmt.Sprintf("0x%x", uint32(1)<<b.cfg.MasqueradeBit) }

// addServicesChain adds the chain both nat hooks jump to: first the rules that mark
// traffic for masquerading, then the dispatch by frontend.
func (b *layout) addServicesChain() {
	ip := b.fam.ip
	var rules []string
	toClusterIP := ip + " daddr @" + SetClusterIPs
	switch notPod, ok := b.podTraffic(true); {
	case b.cfg.MasqueradeAll:
		rules = append(rules, toClusterIP+" jump "+ChainMarkForMasquerade)
	case ok:
		// Traffic from outside the pod network keeps its source otherwise, and the
		// endpoint's reply would bypass this node's conntrack.
		rules = append(rules, toClusterIP+" "+notPod+" jump "+ChainMarkForMasquerade)
	}
	rules = append(rules,
		// externalTrafficPolicy Cluster may send external traffic to another node,
		// whose reply must come back through this one.
		ip+" daddr . meta l4proto . th dport @"+SetExternalMasq+" jump "+ChainMarkForMasquerade,
		ip+" daddr @"+SetNodePortIPs+" meta l4proto . th dport @"+SetNodePortMasq+" jump "+ChainMarkForMasquerade,
		"jump "+ChainServiceIPs,
		ip+" daddr @"+SetNodePortIPs+" jump "+ChainServiceNodePorts,
	)
	b.chain(ChainServices, rules...)
}

// addMasquerading adds the chain that sets the masquerade mark and the postrouting
// chain that acts on it. The mark is cleared before masquerading so that a packet
// re-entering the stack (say, through a tunnel) is not masqueraded twice.
func (b *layout) addMasquerading() {
	mark := b.masqMark()
	b.chain(ChainMarkForMasquerade, "mark set mark or "+mark)
	b.chain(ChainMasquerading,
		// A pod reaching itself through a Service must be masqueraded, or it would
		// see its own address as the source and answer itself directly.
		"ct status dnat "+b.fam.ip+" saddr . "+b.fam.ip+" daddr @"+SetHairpin+" jump "+ChainMarkForMasquerade,
		"mark and "+mark+" == 0 return",
		"mark set mark xor "+mark,
		"masquerade fully-random",
	)
}
