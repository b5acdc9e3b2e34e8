package ruleset

import (
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// Session affinity (sessionAffinity ClientIP) uses shared objects only, so that an
// affinity Service costs elements, not chains or sets, as every other Service:
//
//   - its frontends' endpoints go into affinity-backends-I maps (and the local and
//     node-port variants), which are the backends-I maps of affinity frontends;
//   - the dynamic set affinity-clients-I (affinity-local-clients-I for the local
//     variants) remembers each client . frontend whose client was sent to the
//     frontend's endpoint I;
//   - affinity-dnat-N-T (one chain per endpoint count N, timeout T in seconds and
//     variant) sends a remembered client to its endpoint and any other client to a
//     random one, through affinity-backends-I-T, which records (or refreshes) the
//     client in affinity-clients-I with timeout T and DNATs through the map.
//
// A record names an endpoint by its index, so when a frontend's endpoint list
// changes the Syncer moves its records to the endpoint's new index, and deletes
// those whose endpoint is gone (AffinityMoves).

// affinitySize is the capacity of each affinity-clients-I set: the clients
// remembered at once over all affinity frontends of the family. The kernel
// allocates a dynamic set's elements as they come, so a large bound costs nothing
// until it is used.
const affinitySize = 1 << 20

// affinityChain returns the name of the chain that dispatches frontends of kind k
// with eps under sp's session affinity, adding the chains, maps and sets it needs,
// and the frontend's elements in the affinity backends maps. local selects the
// local variant.
func (b *layout) affinityChain(sp *servicePort, k *frontendKind, key []string, eps []state.Endpoint, local bool) string {
	secs := strconv.FormatInt(int64(affinityTimeout(sp.svc.AffinityTimeout)/time.Second), 10)
	branches := make([]string, len(eps))
	keyText := JoinFields(key)
	for i, e := range eps {
		m := b.affinityBackends(k, i, local, secs)
		b.rs.AddElement(AffinityMapPrefix+b.backendsName(k, i, local), keyText, Elem{Data: endpointValue(e)})
		branches[i] = m
	}
	name := AffinityMapPrefix + b.dnatName(k, len(eps), local) + "-" + secs
	if _, ok := b.rs.Chains[name]; ok {
		return name
	}
	client := b.clientKey()
	rules := make([]string, 0, len(eps)+1)
	vmap := make([]string, len(eps))
	for i, m := range branches {
		rules = append(rules, client+" @"+ClientsSet(i, local)+" goto "+m)
		vmap[i] = strconv.Itoa(i) + " : goto " + m
	}
	rules = append(rules, "numgen random mod "+strconv.Itoa(len(eps))+" vmap { "+strings.Join(vmap, " , ")+" }")
	b.chain(name, rules...)
	return name
}

// affinityBackends returns the name of the chain that records a client of endpoint
// i of kind k for secs seconds and DNATs it through the affinity backends map i,
// adding the chain, the map and the clients set on first use.
func (b *layout) affinityBackends(k *frontendKind, i int, local bool, secs string) string {
	m := AffinityMapPrefix + b.backendsName(k, i, local)
	name := m + "-" + secs
	if _, ok := b.rs.Chains[name]; ok {
		return name
	}
	if _, ok := b.rs.Maps[m]; !ok {
		b.rs.AddMap(&knftables.Map{Name: m, Type: b.backendsType(k)})
	}
	set := ClientsSet(i, local)
	if _, ok := b.rs.Sets[set]; !ok {
		a := b.fam.addrType
		b.rs.AddSet(&knftables.Set{
			Name: set,
			Type: a + " . " + a + " . inet_proto . inet_service",
			// Without "dynamic" some kernels keep the update rule but never add to the set.
			Flags:   []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
			Size:    knftables.PtrTo[uint64](affinitySize),
			Timeout: knftables.PtrTo(state.DefaultAffinityTimeout),
		})
	}
	b.chain(name,
		"update @"+set+" { "+b.clientKey()+" timeout "+secs+"s }",
		"meta l4proto { tcp, udp, sctp } dnat "+b.fam.ip+" to "+b.keyExpr(k)+" map @"+m,
	)
	return name
}

// clientKey is the packet expression of an affinity record: client . frontend.
func (b *layout) clientKey() string {
	ip := b.fam.ip
	return ip + " saddr . " + ip + " daddr . meta l4proto . th dport"
}

// ClientsSet returns the name of the affinity set of the records sent to endpoint
// index i (of the Node-local endpoints when local).
func ClientsSet(i int, local bool) string {
	if local {
		return SetAffinityLocalClients + strconv.Itoa(i)
	}
	return SetAffinityClients + strconv.Itoa(i)
}

// affinityTimeout rounds d up to whole seconds, the unit nft takes, and to at least
// one second, since a zero timeout would mean no expiry.
func affinityTimeout(d time.Duration) time.Duration {
	return max(time.Second, (d+time.Second-1)/time.Second*time.Second)
}

// AffinitySeconds returns the affinity timeout, in seconds, of the Service that
// dispatches frontend (an element key of the class sets) in r, read from the name of
// the affinity chain its class set goes to ("affinity-dnat-3-10800"), or "" when no
// class set of r sends it to an affinity chain.
func (r *Ruleset) AffinitySeconds(frontend string, nodePort bool) string {
	for set, es := range r.Elements {
		c, verdict, ok := ClassOf(set)
		if _, has := es[frontend]; !ok || dispatchChains[c].byAddress == nodePort || !has {
			continue
		}
		chain, ok := strings.CutPrefix(verdict, "goto "+AffinityMapPrefix)
		if !ok {
			continue
		}
		if i := strings.LastIndexByte(chain, '-'); i >= 0 {
			return chain[i+1:]
		}
	}
	return ""
}

// NodePortIPs returns the addresses of r's nodeport-ips set, for
// changeset.AffinityMove.Matches.
func (r *Ruleset) NodePortIPs() map[string]bool {
	out := map[string]bool{}
	for k := range r.Elements[SetNodePortIPs] {
		out[k] = true
	}
	return out
}
