package ruleset

import (
	"fmt"
	"slices"

	"sigs.k8s.io/knftables"
)

// Names of the shared chains, sets and maps of docs/ruleset-layout.md. They exist in
// every ruleset, whatever the Services, so that a sync never creates or deletes them.
const (
	ChainNatPrerouting          = "nat-prerouting"
	ChainNatOutput              = "nat-output"
	ChainNatPostrouting         = "nat-postrouting"
	ChainFilterPrerouting       = "filter-prerouting"
	ChainFilterInput            = "filter-input"
	ChainFilterForward          = "filter-forward"
	ChainFilterOutput           = "filter-output"
	ChainFilterOutputPostDNAT   = "filter-output-post-dnat"
	ChainServices               = "services"
	ChainMarkForMasquerade      = "mark-for-masquerade"
	ChainMasquerading           = "masquerading"
	ChainETPLocal               = "etp-local"
	ChainNodePortETPLocal       = "nodeport-etp-local"
	ChainServiceEndpointsCheck  = "service-endpoints-check"
	ChainNodePortEndpointsCheck = "nodeport-endpoints-check"
	ChainFirewallCheck          = "firewall-check"
	ChainClusterIPsCheck        = "cluster-ips-check"
	ChainReject                 = "reject-chain"

	// The dispatch chains: each sends the frontends of one kind to their verdicts,
	// one rule per verdict in use, matching the frontend against the class set of
	// the verdict (ClassSet). The frontends are elements of those sets, so that a
	// Service change is element operations on plain sets, never on a verdict map.
	ChainServiceIPs                = "service-ips"
	ChainServiceNodePorts          = "service-nodeports"
	ChainETPCluster                = "etp-cluster"
	ChainETPLocalEndpoints         = "etp-local-endpoints"
	ChainNodePortETPCluster        = "nodeport-etp-cluster"
	ChainNodePortETPLocalEndpoints = "nodeport-etp-local-endpoints"
	ChainNoEndpointServices        = "no-endpoint-services"
	ChainNoEndpointNodePorts       = "no-endpoint-nodeports"

	SetClusterIPs    = "cluster-ips"
	SetNodePortIPs   = "nodeport-ips"
	SetHairpin       = "hairpin"
	SetExternalMasq  = "external-masq"
	SetNodePortMasq  = "nodeport-masq"
	SetFirewallIPs   = "firewall-ips"
	SetFirewallAllow = "firewall-allow"
	// The backends maps are per endpoint index: backends-0, backends-1, ...
	MapBackends              = "backends-"
	MapLocalBackends         = "local-backends-"
	MapNodePortBackends      = "nodeport-backends-"
	MapNodePortLocalBackends = "nodeport-local-backends-"
	// AffinityMapPrefix starts the names of the backends maps (and their chains) of
	// session-affinity frontends: affinity-backends-0, affinity-nodeport-backends-0, ...
	AffinityMapPrefix = "affinity-"
	// The dynamic sets of affinity clients are per endpoint index too:
	// affinity-clients-0, ..., affinity-local-clients-0, ...
	SetAffinityClients      = "affinity-clients-"
	SetAffinityLocalClients = "affinity-local-clients-"
)

// The verdicts of the no-endpoint maps.
const (
	verdictReject = "goto " + ChainReject
	verdictDrop   = "drop"
)

// baseChain is a chain hooked into netfilter, with the jumps it holds.
type baseChain struct {
	name     string
	typ      knftables.BaseChainType
	hook     knftables.BaseChainHook
	priority int
	rules    []string
}

// baseChains are the hooks of the layout. Priorities are numbers because nft 1.0.6
// rejects the "dstnat" keyword on an ip nat output chain. The endpoint check of
// locally sent packets runs after output DNAT (priority -90, not -110): node traffic
// to an externalTrafficPolicy Local frontend without local endpoints must reach
// etp-local, which sends it to all endpoints, before the "drop" for that frontend in
// no-endpoint-services can see it; before DNAT it would be dropped.
var baseChains = []baseChain{
	{ChainNatPrerouting, knftables.NATType, knftables.PreroutingHook, -100, []string{"jump " + ChainServices}},
	{ChainNatOutput, knftables.NATType, knftables.OutputHook, -100, []string{"jump " + ChainServices}},
	{ChainNatPostrouting, knftables.NATType, knftables.PostroutingHook, 100, []string{"jump " + ChainMasquerading}},
	{ChainFilterPrerouting, knftables.FilterType, knftables.PreroutingHook, -110, []string{
		"ct state new jump " + ChainFirewallCheck,
	}},
	{ChainFilterInput, knftables.FilterType, knftables.InputHook, -110, []string{
		"ct state new jump " + ChainNodePortEndpointsCheck,
		"ct state new jump " + ChainServiceEndpointsCheck,
	}},
	{ChainFilterForward, knftables.FilterType, knftables.ForwardHook, -110, []string{
		"ct state new jump " + ChainServiceEndpointsCheck,
		"ct state new jump " + ChainClusterIPsCheck,
	}},
	{ChainFilterOutput, knftables.FilterType, knftables.OutputHook, -110, []string{
		"ct state new jump " + ChainFirewallCheck,
	}},
	{ChainFilterOutputPostDNAT, knftables.FilterType, knftables.OutputHook, -90, []string{
		"ct state new jump " + ChainServiceEndpointsCheck,
		"ct state new jump " + ChainClusterIPsCheck,
	}},
}

// addBaseChains adds the hooked chains and their jumps.
func (b *layout) addBaseChains() {
	for _, bc := range baseChains {
		b.rs.AddChain(knftables.Chain{
			Name:     bc.name,
			Type:     knftables.PtrTo(bc.typ),
			Hook:     knftables.PtrTo(bc.hook),
			Priority: knftables.PtrTo(knftables.BaseChainPriority(fmt.Sprint(bc.priority))),
		})
		for _, r := range bc.rules {
			b.rs.AddRule(bc.name, r)
		}
	}
}

// addSetsAndMaps declares every shared set. (The maps of the layout are per
// endpoint index, and the class sets per verdict: both are added on first use.)
func (b *layout) addSetsAndMaps() {
	a := b.fam.addrType
	svcKey := a + " . inet_proto . inet_service"
	npKey := "inet_proto . inet_service"
	for name, typ := range map[string]string{
		SetClusterIPs:   a,
		SetNodePortIPs:  a,
		SetHairpin:      a + " . " + a,
		SetExternalMasq: svcKey,
		SetNodePortMasq: npKey,
		SetFirewallIPs:  svcKey,
	} {
		b.rs.AddSet(&knftables.Set{Name: name, Type: typ})
	}
	// The source ranges of each LoadBalancer frontend with loadBalancerSourceRanges:
	// frontend . range, the range an interval in the last field.
	b.rs.AddSet(&knftables.Set{Name: SetFirewallAllow, Type: svcKey + " . " + a, Flags: []knftables.SetFlag{knftables.IntervalFlag}})
}

// addSharedChains adds the regular chains whose rules do not depend on Services.
// The services, masquerading and etp-local chains are left to the masquerade and
// dispatch code, which owns their content.
func (b *layout) addSharedChains() {
	ip := b.fam.ip
	svcKey := ip + " daddr . meta l4proto . th dport"

	b.chain(ChainServiceEndpointsCheck, "jump "+ChainNoEndpointServices)
	b.chain(ChainNodePortEndpointsCheck, ip+" daddr @"+SetNodePortIPs+" jump "+ChainNoEndpointNodePorts)
	b.chain(ChainFirewallCheck, svcKey+" @"+SetFirewallIPs+" "+svcKey+" . "+ip+" saddr != @"+SetFirewallAllow+" drop")
	b.chain(ChainReject, "reject")

	check := []string{ip + " daddr @" + SetClusterIPs + " reject"}
	// The service ranges are those of the ServiceCIDR objects, as kube-proxy has
	// them, and the configured serviceCIDR (for clusters without ServiceCIDRs, and
	// ranges the objects do not list yet): an address of them that no Service holds
	// is dropped rather than routed on, where it would leak out of the node's
	// default route.
	if cidrs := b.fam.prefixes(slices.Concat(b.cfg.ServiceCIDRs, b.serviceCIDRs)); len(cidrs) > 0 {
		check = append(check, ip+" daddr "+prefixMatch(cidrs)+" drop")
	}
	b.chain(ChainClusterIPsCheck, check...)
}

// chain adds a regular chain with the given rules.
func (b *layout) chain(name string, rules ...string) {
	b.rs.AddChain(knftables.Chain{Name: name})
	for _, r := range rules {
		b.rs.AddRule(name, r)
	}
}
