package proxier

import (
	"net/netip"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/metrics"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// stateGauges keeps the per-family Service and endpoint counts and the counts of
// Service ports with a Local policy and no local endpoint. It updates them from
// the Services a sync changed rather than counting the whole state again: at
// 10,000 Services a recount cost more than the rest of an endpoint change's sync.
type stateGauges struct {
	families map[knftables.Family]*familyGauges
}

// familyGauges are the counts of one family.
type familyGauges struct {
	ipv6               bool
	services           int
	internal, external int
	// endpoints counts, for each endpoint address, protocol and port, the Service
	// names whose slices hold it: the gauge is the number of distinct ones.
	endpoints map[endpointKey]int
}

// endpointKey is an endpoint address with one of its slice's ports.
type endpointKey struct {
	addr  netip.Addr
	proto state.Protocol
	port  uint16
}

func newStateGauges(families []knftables.Family) *stateGauges {
	g := &stateGauges{families: map[knftables.Family]*familyGauges{}}
	for _, fam := range families {
		g.families[fam] = &familyGauges{ipv6: fam == knftables.IPv6Family, endpoints: map[endpointKey]int{}}
	}
	return g
}

// update moves the counts from old, the state they were last updated to (nil for
// none), to cur. Only the Services named in changed may differ between the two
// (every one does after a change of the Node); with no old state, every Service
// of cur is counted.
func (g *stateGauges) update(old, cur *state.ClusterState, changed map[state.ServiceName]bool) {
	for _, fg := range g.families {
		if old == nil {
			for name := range cur.Services {
				fg.add(cur, name, 1)
			}
			for name := range cur.Slices {
				if cur.Services[name] == nil {
					fg.add(cur, name, 1) // slices whose Service is not (yet) there
				}
			}
			continue
		}
		for name := range changed {
			fg.add(old, name, -1)
			fg.add(cur, name, 1)
		}
	}
}

// add adds (sign 1) or removes (sign -1) what the Service name of st counts.
func (fg *familyGauges) add(st *state.ClusterState, name state.ServiceName, sign int) {
	if svc := st.Services[name]; svc != nil && hasClusterIP(svc, fg.ipv6) {
		fg.services += sign
		internal, external := withoutLocalEndpoints(st, svc, fg.ipv6)
		fg.internal += sign * internal
		fg.external += sign * external
	}
	seen := map[endpointKey]bool{}
	for _, sl := range st.Slices[name] {
		if sl.IPv6 != fg.ipv6 {
			continue
		}
		for _, sp := range sl.Ports {
			for _, e := range sl.Endpoints {
				k := endpointKey{e.Address, sp.Protocol, sp.Port}
				if seen[k] {
					continue
				}
				seen[k] = true
				if fg.endpoints[k] += sign; fg.endpoints[k] == 0 {
					delete(fg.endpoints, k)
				}
			}
		}
	}
}

// record sets the gauges of m.
func (g *stateGauges) record(m *metrics.Metrics) {
	for fam, fg := range g.families {
		f := metrics.Family(fam)
		m.Services.WithLabelValues(f).Set(float64(fg.services))
		m.Endpoints.WithLabelValues(f).Set(float64(len(fg.endpoints)))
		m.NoLocalEndpoints.WithLabelValues(metrics.PolicyInternal, f).Set(float64(fg.internal))
		m.NoLocalEndpoints.WithLabelValues(metrics.PolicyExternal, f).Set(float64(fg.external))
	}
}

func hasClusterIP(svc *state.Service, ipv6 bool) bool {
	for _, a := range svc.ClusterIPs {
		if a.Is6() == ipv6 {
			return true
		}
	}
	return false
}

// withoutLocalEndpoints counts, among the ports of svc in a family, those under an
// internal (respectively external) Local traffic policy that have usable endpoints
// of the family, none of them on this node: traffic of that kind reaching this
// node is dropped.
func withoutLocalEndpoints(st *state.ClusterState, svc *state.Service, ipv6 bool) (internal, external int) {
	if !svc.InternalPolicyLocal && !svc.ExternalPolicyLocal {
		return 0, 0
	}
	hasExternal := len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0
	for _, port := range svc.Ports {
		var eps []state.Endpoint
		for _, e := range st.Endpoints(svc, port) {
			if e.Address.Is6() == ipv6 {
				eps = append(eps, e)
			}
		}
		sel := state.Select(svc, eps, st.Node)
		if len(sel.Cluster) == 0 || len(sel.Local) > 0 {
			continue
		}
		if svc.InternalPolicyLocal {
			internal++
		}
		if svc.ExternalPolicyLocal && (hasExternal || port.NodePort != 0) {
			external++
		}
	}
	return internal, external
}
