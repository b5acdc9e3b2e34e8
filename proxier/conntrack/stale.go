// Package conntrack deletes UDP conntrack entries that the new rules make stale:
// flows DNATed to an endpoint that went away, and flows to a Service frontend that
// had no endpoints (and so was never DNATed) once it gains some.
package conntrack

import (
	"cmp"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/vishvananda/netlink"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// protoUDP is the IP protocol number of UDP. Only UDP needs cleaning: TCP and SCTP
// flows to a gone endpoint end by themselves (RST, timeouts), while a UDP client
// that keeps sending keeps its stale entry alive for ever.
const protoUDP = 17

// Filter selects UDP conntrack entries by their original destination and, when set,
// their reply source. It implements netlink.CustomConntrackFilter.
type Filter struct {
	// OrigDst is the frontend the client sent to: a ClusterIP, external or load
	// balancer IP, or a node address for a node port.
	OrigDst netip.AddrPort
	// ReplySrc, when valid, is the endpoint the flow was DNATed to.
	ReplySrc netip.AddrPort
	// NotNATed selects only flows that were not DNATed (the reply comes from the
	// frontend itself).
	NotNATed bool
}

// String returns the filter in conntrack(8)'s words.
func (f Filter) String() string {
	s := "-p udp --orig-dst " + f.OrigDst.Addr().String() + " --dport " + itoa(f.OrigDst.Port())
	if f.ReplySrc.IsValid() {
		s += " --reply-src " + f.ReplySrc.Addr().String() + " --reply-port-src " + itoa(f.ReplySrc.Port())
	}
	if f.NotNATed {
		s += " (not DNATed)"
	}
	return s
}

// MatchConntrackFlow reports whether flow is selected by f.
func (f Filter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != protoUDP {
		return false
	}
	if addrPort(flow.Forward.DstIP, flow.Forward.DstPort) != f.OrigDst {
		return false
	}
	reply := addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort)
	if f.ReplySrc.IsValid() && reply != f.ReplySrc {
		return false
	}
	return !f.NotNATed || reply == f.OrigDst
}

// frontend is a UDP address and port that the ruleset dispatches to endpoints.
type frontend = netip.AddrPort

// frontends maps each UDP frontend of a ClusterState to the endpoints it may have
// DNATed flows to.
type frontends map[frontend]map[netip.AddrPort]bool

// Stale returns the filters that select the conntrack entries made stale by going
// from old to new (old is nil before the first sync), sorted and without duplicates:
//
//   - for every endpoint a UDP frontend no longer uses (the endpoint, the Service
//     port or the Service went away), the flows to that frontend DNATed to it;
//   - for every UDP frontend that has endpoints now and had none before, the flows
//     to it that were not DNATed. Before the first sync every frontend counts as
//     having had none, which is safe: a flow to a frontend with endpoints that was
//     not DNATed is always stale.
//
// It looks at every Service of both states; Frontends.Stale finds the same
// filters from the changed Services alone.
func Stale(old, new *state.ClusterState) []Filter {
	var prev frontends
	if old != nil {
		prev = udpFrontends(old)
	}
	return diff(prev, udpFrontends(new))
}

// diff returns the filters of going from prev to cur (see Stale), sorted and
// without duplicates.
func diff(prev, cur frontends) []Filter {
	seen := map[Filter]bool{}
	for fe, eps := range prev {
		for ep := range eps {
			if !cur[fe][ep] {
				seen[Filter{OrigDst: fe, ReplySrc: ep}] = true
			}
		}
	}
	for fe, eps := range cur {
		if len(eps) > 0 && len(prev[fe]) == 0 {
			seen[Filter{OrigDst: fe, NotNATed: true}] = true
		}
	}
	out := make([]Filter, 0, len(seen))
	for f := range seen {
		out = append(out, f)
	}
	slices.SortFunc(out, compareFilters)
	return out
}

// udpFrontends lists the UDP frontends of st with the endpoints each may use.
func udpFrontends(st *state.ClusterState) frontends {
	out := frontends{}
	for _, svc := range st.Services {
		out.addService(st, svc)
	}
	return out
}

// addService adds the UDP frontends of svc in st with the endpoints each may use:
// its ClusterIPs use the internal selection; external and load-balancer IPs and
// node ports (on every node address) use the external one, plus the cluster-wide
// one under a Local policy, as traffic from pods and the node ignores that policy.
func (f frontends) addService(st *state.ClusterState, svc *state.Service) {
	for _, p := range svc.Ports {
		if p.Protocol != state.UDP {
			continue
		}
		sel := state.Select(svc, st.Endpoints(svc, p), st.Node)
		external := sel.External
		if svc.ExternalPolicyLocal {
			external = append(slices.Clone(sel.External), sel.Cluster...)
		}
		for _, a := range svc.ClusterIPs {
			f.add(netip.AddrPortFrom(a, p.Port), sel.Internal)
		}
		for _, a := range slices.Concat(svc.ExternalIPs, svc.LoadBalancerIPs) {
			f.add(netip.AddrPortFrom(a, p.Port), external)
		}
		if p.NodePort != 0 {
			for _, a := range st.Node.Addresses {
				if !a.IsLoopback() {
					f.add(netip.AddrPortFrom(a, p.NodePort), external)
				}
			}
		}
	}
}

// add records fe with those of eps that are of its family.
func (f frontends) add(fe frontend, eps []state.Endpoint) {
	set := f[fe]
	if set == nil {
		set = map[netip.AddrPort]bool{}
		f[fe] = set
	}
	for _, e := range eps {
		if e.Address.Is4() == fe.Addr().Is4() {
			set[e.AddrPort()] = true
		}
	}
}

func compareFilters(a, b Filter) int {
	return cmp.Or(a.OrigDst.Compare(b.OrigDst), a.ReplySrc.Compare(b.ReplySrc), boolCmp(a.NotNATed, b.NotNATed))
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }
