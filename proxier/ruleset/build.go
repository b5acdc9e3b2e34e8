package ruleset

import (
	"fmt"
	"net/netip"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// TableComment is the comment of every table the proxier owns.
const TableComment = "nftproxy: Kubernetes Service proxy"

// Build returns the ruleset of docs/ruleset-layout.md for one family (ip or ip6)
// of st, as this node (st.Node) should have it. cfg must already be defaulted and
// valid. Only addresses of the family are used, and a Service takes part only when
// it has a ClusterIP of the family. Build is pure and deterministic: it reads st
// and cfg without changing or keeping them, and equal inputs give equal rulesets.
//
// When two Services claim the same frontend (address, protocol and port, or node
// port), a ClusterIP wins over an external address, and otherwise the Service
// first in namespace/name order wins; the loser gets no rules for that frontend.
//
// Build panics when family is neither ip nor ip6: that is a programming error, and
// an inet table would need a different layout.
//
// For a large cluster, Build builds the Services' rules on up to GOMAXPROCS
// goroutines (see fragments.go); the result does not depend on their number.
func Build(st *state.ClusterState, cfg Config, family knftables.Family) *Ruleset {
	CheckFamily(family)
	return buildMerged(st, cfg, family)
}

// CheckFamily panics when family is neither ip nor ip6, the families a table of
// this layout can have.
func CheckFamily(family knftables.Family) {
	if family != knftables.IPv4Family && family != knftables.IPv6Family {
		panic(fmt.Sprintf("ruleset.Build: family %q: want ip or ip6", family))
	}
}

// BuildBase returns the objects of st that do not belong to any Service: the table,
// base and shared chains, sets and maps, the node's NodePort addresses and the drop
// of unallocated service addresses (cfg.ServiceCIDRs and st.ServiceCIDRs).
func BuildBase(cfg Config, family knftables.Family, st *state.ClusterState) *Ruleset {
	b := &layout{rs: New(family, cfg.Table), cfg: cfg, fam: newFamilyInfo(family), node: st.Node, serviceCIDRs: st.ServiceCIDRs}
	b.rs.Comment = TableComment
	b.addBaseChains()
	b.addSetsAndMaps()
	b.addSharedChains()
	b.addServicesChain()
	b.addMasquerading()
	b.addETPLocalChains()
	b.addNodePortIPs()
	return b.rs
}

// Claimer arbitrates frontends between Services: it reports whether Service port
// id, claiming frontend key with priority prio (0 for ClusterIPs, which win, 1 for
// the rest), owns it.
type Claimer func(key []string, id string, prio int) bool

// BuildService returns the objects Service svc contributes (nil when it has no
// ClusterIP of the family), using claim to arbitrate frontends with other Services.
// It reads its arguments and writes only the Ruleset it returns, so fragments may
// be built concurrently. The Ruleset is a fragment: its elements are listed (see
// Listed), not in Elements.
func BuildService(cfg Config, family knftables.Family, st *state.ClusterState, svc *state.Service, claim Claimer) *Ruleset {
	b := &layout{rs: newFragment(family, cfg.Table), cfg: cfg, fam: newFamilyInfo(family), node: st.Node, claimer: claim}
	if len(b.fam.addrs(svc.ClusterIPs)) == 0 {
		return nil
	}
	b.claimClusterIPs([]*state.Service{svc})
	b.addService(st, svc)
	b.rs.list = LastOfEach(b.rs.list)
	return b.rs
}

// BuildAll builds the ruleset of both families, keyed by family.
func BuildAll(st *state.ClusterState, cfg Config) map[knftables.Family]*Ruleset {
	return map[knftables.Family]*Ruleset{
		knftables.IPv4Family: Build(st, cfg, knftables.IPv4Family),
		knftables.IPv6Family: Build(st, cfg, knftables.IPv6Family),
	}
}

// layout holds what building one fragment (the node's objects, a Service's, the
// dispatch chains) needs while it fills in the ruleset.
type layout struct {
	rs   *Ruleset
	cfg  Config
	fam  familyInfo
	node state.Node
	// serviceCIDRs are the ranges of the cluster's ServiceCIDR objects (BuildBase
	// only).
	serviceCIDRs []netip.Prefix
	// claimer arbitrates frontends between Services.
	claimer Claimer
	// prio is the priority of the claims being made.
	prio int
}

// servicePort is one port of a Service being built, with its endpoints chosen.
type servicePort struct {
	svc  *state.Service
	port state.ServicePort
	// id is the port's PortID, which names its chains and comments its elements.
	id  string
	sel state.Selection
}

// addNodePortIPs fills nodeport-ips with the node's addresses that serve node ports:
// those of the family inside cfg.NodePortAddresses or, with cfg.NodePortPrimary,
// the node's primary IP of the family (all of them when neither restricts the
// family, as kube-proxy does), and never loopback, whose traffic the kernel will
// not route to another host after DNAT.
func (b *layout) addNodePortIPs() {
	allowed := b.fam.prefixes(b.cfg.NodePortAddresses)
	var primary netip.Addr
	if b.cfg.NodePortPrimary {
		primary = b.node.PrimaryIP(b.fam.v6)
	}
	restricted := len(allowed) > 0 || b.cfg.NodePortPrimary
	for _, a := range b.fam.addrs(b.node.Addresses) {
		if a.IsLoopback() || a.IsUnspecified() {
			continue
		}
		if restricted && a != primary && !slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(a) }) {
			continue
		}
		b.rs.AddElement(SetNodePortIPs, addrString(a), Elem{})
	}
}

// claimClusterIPs claims every ClusterIP frontend before any external one, since
// ClusterIPs are allocated uniquely and an ExternalIP that reuses one is the error.
func (b *layout) claimClusterIPs(svcs []*state.Service) {
	b.prio = 0
	defer func() { b.prio = 1 }()
	for _, svc := range svcs {
		for _, p := range svc.Ports {
			for _, a := range b.fam.addrs(svc.ClusterIPs) {
				b.claim(frontendKey(a, p), PortID(svc, p))
			}
		}
	}
}

// claim reports whether Service port id may use the frontend key, claiming it
// when it is free.
func (b *layout) claim(key []string, id string) bool {
	return b.claimer(key, id, b.prio)
}

// addService adds everything one Service needs: its ClusterIPs in cluster-ips and,
// per port, its frontends.
func (b *layout) addService(st *state.ClusterState, svc *state.Service) {
	for _, a := range b.fam.addrs(svc.ClusterIPs) {
		b.rs.AddElement(SetClusterIPs, addrString(a), Elem{})
	}
	for _, p := range svc.Ports {
		eps := b.familyEndpoints(st.Endpoints(svc, p))
		sp := &servicePort{svc: svc, port: p, id: PortID(svc, p), sel: state.Select(svc, eps, b.node)}
		b.addHairpin(sp)
		b.addClusterIPFrontends(sp)
		b.addExternalFrontends(sp)
		b.addNodePortFrontend(sp)
	}
}

// familyEndpoints returns the endpoints of the family, so that selection (topology
// hints in particular) looks only at the endpoints this table can reach, as it
// would with the EndpointSlices of this family alone.
func (b *layout) familyEndpoints(eps []state.Endpoint) []state.Endpoint {
	if !slices.ContainsFunc(eps, func(e state.Endpoint) bool {
		return !b.fam.has(e.Address) || e.Address != e.Address.Unmap().WithZone("")
	}) {
		return eps[:len(eps):len(eps)] // all of the family already: callers only read
	}
	var out []state.Endpoint
	for _, e := range eps {
		if b.fam.has(e.Address) {
			e.Address = e.Address.Unmap().WithZone("")
			out = append(out, e)
		}
	}
	return out
}

// addHairpin adds every usable endpoint of sp to the hairpin set. Endpoints of other
// nodes count too: a pod whose node does not proxy (or routes Service traffic through
// this node) may reach itself through this node's ruleset.
func (b *layout) addHairpin(sp *servicePort) {
	for _, eps := range [][]state.Endpoint{sp.sel.Cluster, sp.sel.Local} {
		for _, e := range eps {
			a := addrString(e.Address)
			b.rs.AddElement(SetHairpin, a+" . "+a, Elem{})
		}
	}
}

// frontendKey returns the key of an address frontend: address . protocol . port.
func frontendKey(a netip.Addr, p state.ServicePort) []string {
	return []string{addrString(a), string(p.Protocol), itoa(p.Port)}
}
