package ruleset

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// frontendKind names the maps, sets and chains of one kind of frontend: address
// frontends (ClusterIP, ExternalIP, LoadBalancer IP; keyed address . proto . port)
// or node ports (keyed proto . port on any address in nodeport-ips). The two kinds
// are built by the same code with these names swapped in.
type frontendKind struct {
	dispatch      string
	noEndpoints   string
	masq          string
	etpChain      string
	etpCluster    string
	etpLocal      string
	backends      string
	localBackends string
	// dnatPrefix starts the names of the dnat-N chains of this kind, and
	// dnatLocalPrefix those of its dnat-local-N chains.
	dnatPrefix, dnatLocalPrefix string
	// byAddress is true when the frontend key starts with the destination address.
	byAddress bool
}

var (
	addressFrontends = frontendKind{
		dispatch: ChainServiceIPs, noEndpoints: ChainNoEndpointServices, masq: SetExternalMasq,
		etpChain: ChainETPLocal, etpCluster: ChainETPCluster, etpLocal: ChainETPLocalEndpoints,
		backends: MapBackends, localBackends: MapLocalBackends,
		dnatPrefix: "dnat-", dnatLocalPrefix: "dnat-local-", byAddress: true,
	}
	nodePortFrontends = frontendKind{
		dispatch: ChainServiceNodePorts, noEndpoints: ChainNoEndpointNodePorts, masq: SetNodePortMasq,
		etpChain: ChainNodePortETPLocal, etpCluster: ChainNodePortETPCluster, etpLocal: ChainNodePortETPLocalEndpoints,
		backends: MapNodePortBackends, localBackends: MapNodePortLocalBackends,
		dnatPrefix: "nodeport-dnat-", dnatLocalPrefix: "nodeport-dnat-local-",
	}
)

// addETPLocalChains adds the chains that split traffic to an externalTrafficPolicy
// Local frontend: pod traffic and the node's own traffic may use every endpoint
// (the node's own source address must be masqueraded, since the frontend address is
// local and the reply would not come back otherwise), while traffic from outside
// only goes to this node's endpoints, keeping the client's source address.
func (b *layout) addETPLocalChains() {
	for _, k := range []*frontendKind{&addressFrontends, &nodePortFrontends} {
		var rules []string
		if pod, ok := b.podTraffic(false); ok {
			rules = append(rules, pod+" jump "+k.etpCluster)
		}
		rules = append(rules,
			"fib saddr type local jump "+ChainMarkForMasquerade,
			"fib saddr type local jump "+k.etpCluster,
			"jump "+k.etpLocal,
		)
		b.chain(k.etpChain, rules...)
	}
}

// keyExpr returns the packet expression that matches the frontend keys of kind k.
func (b *layout) keyExpr(k *frontendKind) string {
	if k.byAddress {
		return b.fam.ip + " daddr . meta l4proto . th dport"
	}
	return "meta l4proto . th dport"
}

// addClusterIPFrontends dispatches each ClusterIP of sp to its internal endpoints:
// the local ones under internalTrafficPolicy Local, else the cluster-wide ones.
func (b *layout) addClusterIPFrontends(sp *servicePort) {
	for _, a := range b.fam.addrs(sp.svc.ClusterIPs) {
		if key := frontendKey(a, sp.port); b.claim(key, sp.id) {
			b.route(sp, &addressFrontends, addressFrontends.dispatch, key, sp.sel.Internal, sp.svc.InternalPolicyLocal)
		}
	}
}

// addExternalFrontends dispatches each ExternalIP and LoadBalancer IP of sp, behind
// the source-range firewall for LoadBalancer IPs.
func (b *layout) addExternalFrontends(sp *servicePort) {
	lbs := b.fam.addrs(sp.svc.LoadBalancerIPs)
	for _, a := range b.fam.addrs(slices.Concat(sp.svc.ExternalIPs, sp.svc.LoadBalancerIPs)) {
		key := frontendKey(a, sp.port)
		if !b.claim(key, sp.id) {
			continue
		}
		if len(sp.svc.SourceRanges) > 0 && slices.Contains(lbs, a) {
			b.addFirewall(sp, key)
		}
		b.addExternalFrontend(sp, &addressFrontends, key)
	}
}

// addNodePortFrontend dispatches the node port of sp, if it has one.
func (b *layout) addNodePortFrontend(sp *servicePort) {
	if sp.port.NodePort == 0 {
		return
	}
	key := []string{string(sp.port.Protocol), itoa(sp.port.NodePort)}
	if b.claim(key, sp.id) {
		b.addExternalFrontend(sp, &nodePortFrontends, key)
	}
}

// addExternalFrontend dispatches a frontend reachable from outside the cluster.
// Under externalTrafficPolicy Cluster it is masqueraded and sent to every endpoint;
// under Local it goes through the etp-local chain, which picks the etp-cluster or
// etp-local map by where the traffic comes from.
func (b *layout) addExternalFrontend(sp *servicePort, k *frontendKind, key []string) {
	if !sp.svc.ExternalPolicyLocal {
		b.rs.AddElement(k.masq, JoinFields(key), Elem{})
		b.route(sp, k, k.dispatch, key, sp.sel.Cluster, false)
		return
	}
	if !sp.sel.Any {
		b.noEndpoints(sp, k, key)
		return
	}
	b.dispatchElement(k.dispatch, key, "goto "+k.etpChain, sp)
	if len(sp.sel.Cluster) > 0 {
		b.dispatchElement(k.etpCluster, key, b.dispatchVerdict(sp, k, key, sp.sel.Cluster, false), sp)
	}
	b.route(sp, k, k.etpLocal, key, sp.sel.Local, true)
}

// route puts frontend key into dispatch map m, sending it to eps, or, when eps is
// empty, into the no-endpoint map of its kind.
func (b *layout) route(sp *servicePort, k *frontendKind, m string, key []string, eps []state.Endpoint, local bool) {
	if len(eps) == 0 {
		b.noEndpoints(sp, k, key)
		return
	}
	b.dispatchElement(m, key, b.dispatchVerdict(sp, k, key, eps, local), sp)
}

// noEndpoints sends new connections to frontend key to the reject chain when the
// Service port has no usable endpoint at all, so that clients fail fast, and drops
// them when it only lacks endpoints for this traffic (a Local policy without local
// endpoints): the Service works, just not on this node, so clients must not be told
// it refuses connections; a load balancer's health check steers them elsewhere.
func (b *layout) noEndpoints(sp *servicePort, k *frontendKind, key []string) {
	verdict := verdictDrop
	if !sp.sel.Any {
		verdict = verdictReject
	}
	b.dispatchElement(k.noEndpoints, key, verdict, sp)
}

// dispatchVerdict returns the verdict that DNATs traffic of frontend key to one of
// eps (non-empty), adding the objects it needs: the shared dnat-N chain and, for
// each endpoint i, the element of the frontend in backends map i; under
// sessionAffinity ClientIP the affinity chains and maps instead (affinity.go).
// local selects the local variants (dnat-local-N, local-backends-i), which hold a
// frontend's local endpoints beside its cluster ones.
func (b *layout) dispatchVerdict(sp *servicePort, k *frontendKind, key []string, eps []state.Endpoint, local bool) string {
	if sp.svc.AffinityTimeout > 0 {
		return "goto " + b.affinityChain(sp, k, key, eps, local)
	}
	keyText := JoinFields(key)
	for i, e := range eps {
		b.rs.AddElement(b.pickChain(k, i, local), keyText, Elem{Data: endpointValue(e)})
	}
	return "goto " + b.dnatChain(k, len(eps), local)
}

// endpointValue returns the value of endpoint e in a backends map: address . port.
func endpointValue(e state.Endpoint) string {
	return addrString(e.Address) + " . " + itoa(e.Port)
}

// dnatName returns the name of the dnat chain of kind k for n endpoints.
func (b *layout) dnatName(k *frontendKind, n int, local bool) string {
	if local {
		return numbered(k.dnatLocalPrefix, n)
	}
	return numbered(k.dnatPrefix, n)
}

// numberedNames caches the names numbered returns, which every Service's fragment
// asks for again.
var numberedNames sync.Map

type numberedKey struct {
	prefix string
	n      int
}

// numbered returns prefix followed by n in decimal.
func numbered(prefix string, n int) string {
	k := numberedKey{prefix, n}
	if v, ok := numberedNames.Load(k); ok {
		return v.(string)
	}
	name := prefix + strconv.Itoa(n)
	numberedNames.Store(k, name)
	return name
}

// dnatChain returns the name of the chain that picks one of n backends of the kind
// at random, adding it on first use so that only the counts in use have a chain.
func (b *layout) dnatChain(k *frontendKind, n int, local bool) string {
	name := b.dnatName(k, n, local)
	if _, ok := b.rs.Chains[name]; ok {
		return name
	}
	for i := range n {
		b.pickChain(k, i, local)
	}
	b.rs.Chains[name] = shared(b.fam.v6, kindChain, name, func() *Chain {
		branches := make([]string, n)
		for i := range n {
			branches[i] = strconv.Itoa(i) + " : goto " + b.backendsName(k, i, local)
		}
		// The commas stand apart from the chain names so that no tool splitting the
		// rule on spaces reads "name," as a chain name.
		return newChain(name, "numgen random mod "+strconv.Itoa(n)+" vmap { "+strings.Join(branches, " , ")+" }")
	})
	return name
}

// backendsName returns the name of backends map i of kind k.
func (b *layout) backendsName(k *frontendKind, i int, local bool) string {
	name := k.backends
	if local {
		name = k.localBackends
	}
	return numbered(name, i)
}

// keyType returns the type of the frontend keys of kind k.
func (b *layout) keyType(k *frontendKind) string {
	if k.byAddress {
		return b.fam.addrType + " . inet_proto . inet_service"
	}
	return "inet_proto . inet_service"
}

// backendsType returns the type of the backends maps of kind k: frontend key to
// endpoint address . port.
func (b *layout) backendsType(k *frontendKind) string {
	return b.keyType(k) + " : " + b.fam.addrType + " . inet_service"
}

// pickChain returns the name of backends map i of the kind, which maps each
// frontend to its endpoint i, adding the map and the chain of the same name that
// DNATs through it on first use. The maps are declared by type rather than typeof:
// nft 1.0.6 refuses new rules that use a typeof map with "th dport" already in the
// kernel ("conflicting protocols specified").
func (b *layout) pickChain(k *frontendKind, i int, local bool) string {
	name := b.backendsName(k, i, local)
	if _, ok := b.rs.Maps[name]; ok {
		return name
	}
	b.rs.Maps[name] = shared(b.fam.v6, kindMap, name, func() *knftables.Map {
		return &knftables.Map{Name: name, Type: b.backendsType(k)}
	})
	// The protocol match tells nft that th dport is meaningful; every Service
	// protocol shares the chain.
	b.rs.Chains[name] = shared(b.fam.v6, kindChain, name, func() *Chain {
		return newChain(name, "meta l4proto { tcp, udp, sctp } dnat "+b.fam.ip+" to "+b.keyExpr(k)+" map @"+name)
	})
	return name
}

// dispatchElement sends frontend key to verdict in dispatch chain c: it adds the key
// to the class set of that verdict, commented with its Service port, adding the set
// on first use. dispatchChainsOf then gives c a rule for the set.
func (b *layout) dispatchElement(c string, key []string, verdict string, sp *servicePort) {
	name := ClassSet(c, verdict)
	if _, ok := b.rs.Sets[name]; !ok {
		b.rs.Sets[name] = shared(b.fam.v6, kindSet, name, func() *knftables.Set {
			return &knftables.Set{Name: name, Type: b.keyType(dispatchChains[c])}
		})
	}
	b.rs.AddElement(name, JoinFields(key), Elem{Data: elementComment(sp.id)})
}

// dispatchChains are the dispatch chains, with the kind of frontend each dispatches.
var dispatchChains = map[string]*frontendKind{
	ChainServiceIPs:                &addressFrontends,
	ChainETPCluster:                &addressFrontends,
	ChainETPLocalEndpoints:         &addressFrontends,
	ChainNoEndpointServices:        &addressFrontends,
	ChainServiceNodePorts:          &nodePortFrontends,
	ChainNodePortETPCluster:        &nodePortFrontends,
	ChainNodePortETPLocalEndpoints: &nodePortFrontends,
	ChainNoEndpointNodePorts:       &nodePortFrontends,
}

// IsDispatchChain reports whether name is a dispatch chain: its rules, one per class
// set, are disjoint, so their order does not matter.
func IsDispatchChain(name string) bool {
	_, ok := dispatchChains[name]
	return ok
}

// classSep joins a dispatch chain and the target of a verdict into a class set name.
const classSep = "-to-"

// ClassSet returns the name of the class set that holds the frontends dispatch chain
// c sends to verdict ("goto dnat-3" or "drop"): service-ips-to-dnat-3,
// no-endpoint-services-to-drop.
func ClassSet(c, verdict string) string {
	return c + classSep + strings.TrimPrefix(verdict, "goto ")
}

// ClassOf splits the name of a class set into its dispatch chain and verdict; ok is
// false when set is not a class set.
func ClassOf(set string) (chain, verdict string, ok bool) {
	chain, target, ok := strings.Cut(set, classSep)
	if !ok || target == "" {
		return "", "", false
	}
	if _, ok := dispatchChains[chain]; !ok {
		return "", "", false
	}
	if target == verdictDrop {
		return chain, verdictDrop, true
	}
	return chain, "goto " + target, true
}

// DispatchChainsOf returns the dispatch chains of rs, derived from its class sets:
// each chain matches the destination against each of its class sets in name order
// and issues the set's verdict. A frontend is in at most one class set of a chain.
// The chains do not belong to any Service: Build and the changeset.Builder add them once the
// Services' fragments are merged.
func DispatchChainsOf(rs *Ruleset) *Ruleset {
	b := &layout{rs: New(rs.Family, rs.Table), fam: newFamilyInfo(rs.Family)}
	for c := range dispatchChains {
		b.chain(c)
	}
	for _, s := range SortedKeys(rs.Sets) {
		if c, verdict, ok := ClassOf(s); ok {
			b.rs.AddRule(c, b.keyExpr(dispatchChains[c])+" @"+s+" "+verdict)
		}
	}
	return b.rs
}

// sharedObjs holds the chains, sets and maps that are a function of the family and
// their name alone (dnat-N, backends-I and their chains, class sets), so that the
// fragments of every Service share one copy of each instead of building their own:
// at 50,000 Services that was a fifth of a first build's allocations. The objects
// are never modified once made; the number of names is that of the endpoint counts
// and verdicts ever in use.
var sharedObjs sync.Map

// objKind tells apart the kinds of shared objects, whose names may coincide.
type objKind uint8

const (
	kindChain objKind = iota
	kindSet
	kindMap
)

type sharedKey struct {
	v6   bool
	kind objKind
	name string
}

// shared returns the shared object of the kind named name in the family (v6 for
// ip6), made by mk on first use.
func shared[T any](v6 bool, kind objKind, name string, mk func() *T) *T {
	k := sharedKey{v6, kind, name}
	if v, ok := sharedObjs.Load(k); ok {
		return v.(*T)
	}
	v, _ := sharedObjs.LoadOrStore(k, mk())
	return v.(*T)
}

// newChain returns a regular chain with the given rules.
func newChain(name string, rules ...string) *Chain {
	c := &Chain{Chain: knftables.Chain{Name: name}}
	for _, r := range rules {
		c.Rules = append(c.Rules, &knftables.Rule{Chain: name, Rule: r})
	}
	return c
}

func itoa(n uint16) string { return strconv.Itoa(int(n)) }
