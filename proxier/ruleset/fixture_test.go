package ruleset

import (
	"net/netip"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// This file builds ClusterState inputs for the tests directly from state types, so
// that the goldens depend on nothing but Build.

// The node every fixture runs on, with an address of each kind the tests need:
// a primary address in 192.168.0.0/24, a second one outside it, and loopback.
const nodeName = "node-a"

func newCluster() *state.ClusterState {
	st := state.NewClusterState()
	st.Node = state.Node{
		Name: nodeName,
		Zone: "zone-a",
		Addresses: addrs(
			"192.168.0.10", "10.10.0.10", "127.0.0.1",
			"fd00:192:168::10", "::1",
		),
	}
	return st
}

// baseConfig is the configuration of most goldens: the ClusterCIDR detector over
// 10.0.0.0/8 and fd01::/48, and a service range per family.
func baseConfig() Config {
	return Config{
		LocalMode:    LocalClusterCIDR,
		ClusterCIDRs: prefixes("10.0.0.0/8", "fd01::/48"),
		ServiceCIDRs: prefixes("172.30.0.0/16", "fd02::/112"),
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// svcOpt changes a Service under construction.
type svcOpt func(*state.Service)

// addService adds Service "ns/name" with the given ClusterIPs (comma-separated) and
// options, as a ClusterIP Service unless an option says otherwise.
func addService(st *state.ClusterState, id, clusterIPs string, opts ...svcOpt) *state.Service {
	ns, name, _ := strings.Cut(id, "/")
	svc := &state.Service{
		Name:       state.ServiceName{Namespace: ns, Name: name},
		Type:       "ClusterIP",
		ClusterIPs: addrs(strings.Split(clusterIPs, ",")...),
	}
	for _, o := range opts {
		o(svc)
	}
	st.Services[svc.Name] = svc
	return svc
}

func ports(ps ...state.ServicePort) svcOpt {
	return func(s *state.Service) { s.Ports = append(s.Ports, ps...) }
}

func tcp(name string, port, nodePort uint16) state.ServicePort {
	return state.ServicePort{Name: name, Protocol: state.TCP, Port: port, NodePort: nodePort}
}

func udp(name string, port, nodePort uint16) state.ServicePort {
	return state.ServicePort{Name: name, Protocol: state.UDP, Port: port, NodePort: nodePort}
}

func sctp(name string, port, nodePort uint16) state.ServicePort {
	return state.ServicePort{Name: name, Protocol: state.SCTP, Port: port, NodePort: nodePort}
}

func nodePortType(s *state.Service) { s.Type = "NodePort" }

func loadBalancer(ips ...string) svcOpt {
	return func(s *state.Service) { s.Type = "LoadBalancer"; s.LoadBalancerIPs = addrs(ips...) }
}

func externalIPs(ips ...string) svcOpt {
	return func(s *state.Service) { s.ExternalIPs = addrs(ips...) }
}

func sourceRanges(ps ...string) svcOpt {
	return func(s *state.Service) { s.SourceRanges = prefixes(ps...) }
}

func etpLocal(s *state.Service) { s.ExternalPolicyLocal = true }

func itpLocal(s *state.Service) { s.InternalPolicyLocal = true }

func affinity(d time.Duration) svcOpt {
	return func(s *state.Service) { s.AffinityTimeout = d }
}

// addSlice adds EndpointSlice name of svc with the given ports and endpoints; its
// address type is that of the first endpoint.
func addSlice(st *state.ClusterState, svc *state.Service, name string, ps []state.EndpointPort, eps ...state.SliceEndpoint) {
	if st.Slices[svc.Name] == nil {
		st.Slices[svc.Name] = map[string]*state.EndpointSlice{}
	}
	sl := &state.EndpointSlice{Name: name, Service: svc.Name, Ports: ps, Endpoints: eps}
	if len(eps) > 0 {
		sl.IPv6 = eps[0].Address.Is6()
	}
	st.Slices[svc.Name][name] = sl
}

// targets returns the slice ports of svc: each Service port's name and protocol
// with the given target port.
func targets(svc *state.Service, port uint16) []state.EndpointPort {
	var out []state.EndpointPort
	for _, p := range svc.Ports {
		out = append(out, state.EndpointPort{Name: p.Name, Protocol: p.Protocol, Port: port})
	}
	return out
}

// epOpt changes an endpoint under construction.
type epOpt func(*state.SliceEndpoint)

// ep returns a ready endpoint at addr on node.
func ep(addr, node string, opts ...epOpt) state.SliceEndpoint {
	e := state.SliceEndpoint{Address: netip.MustParseAddr(addr), Ready: true, Serving: true, NodeName: node}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func notReady(e *state.SliceEndpoint) { e.Ready, e.Serving = false, false }

// terminating marks an endpoint as terminating, still serving or not.
func terminating(serving bool) epOpt {
	return func(e *state.SliceEndpoint) { e.Ready, e.Serving, e.Terminating = false, serving, true }
}

func hints(zones ...string) epOpt {
	return func(e *state.SliceEndpoint) { e.ZoneHints = zones }
}

func zone(z string) epOpt {
	return func(e *state.SliceEndpoint) { e.Zone = z }
}
