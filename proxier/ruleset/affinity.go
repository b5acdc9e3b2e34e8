package ruleset

import (
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// affinityChain returns the name of the sessionAffinity ClientIP chain of sp over
// eps, adding it on first use. A client found in an endpoint's affinity set goes
// back to that endpoint; a new client picks one at random. The local variant
// (local endpoints only, for a Local traffic policy) shares the per-endpoint chains
// and sets with the cluster one, so a client keeps its endpoint whichever way it
// comes in.
func (b *builder) affinityChain(sp *servicePort, eps []state.Endpoint, local bool) string {
	kind := kindAffinity
	if local {
		kind = kindAffinityLocal
	}
	name := PortChainName(kind, sp.id)
	if _, ok := b.rs.Chains[name]; ok {
		return name
	}
	var rules, branches []string
	for i, e := range eps {
		ep := b.affinityEndpoint(sp, e)
		rules = append(rules, b.fam.ip+" saddr @"+ep+" goto "+ep)
		branches = append(branches, fmt.Sprintf("%d : goto %s", i, ep))
	}
	// The commas stand apart from the chain names so that no tool splitting the
	// rule on spaces reads "name," as a chain name.
	rules = append(rules, fmt.Sprintf("numgen random mod %d vmap { %s }", len(eps), strings.Join(branches, " , ")))
	b.chain(name, rules...)
	return name
}

// affinityEndpoint returns the name of the chain (and of the set, which has the
// same name) that records the client of endpoint e of sp and DNATs to e, adding
// them on first use.
func (b *builder) affinityEndpoint(sp *servicePort, e state.Endpoint) string {
	name := EndpointChainName(kindAffinityEP, sp.id, e.AddrPort())
	if _, ok := b.rs.Chains[name]; ok {
		return name
	}
	timeout := affinityTimeout(sp.svc.AffinityTimeout)
	b.rs.AddSet(&knftables.Set{
		Name: name,
		Type: b.fam.addrType,
		// Without "dynamic" some kernels keep the update rule but never add to the set.
		Flags:   []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
		Timeout: &timeout,
	})
	ip := b.fam.ip
	b.chain(name,
		"update @"+name+" { "+ip+" saddr }",
		"meta l4proto "+string(sp.port.Protocol)+" dnat "+ip+" to "+e.AddrPort().String(),
	)
	return name
}

// affinityTimeout rounds d up to whole seconds, the unit nft takes, and to at least
// one second, since a zero timeout would mean no expiry.
func affinityTimeout(d time.Duration) time.Duration {
	return max(time.Second, (d+time.Second-1)/time.Second*time.Second)
}
