package state

import (
	"net/netip"
	"slices"
	"sort"
)

// Endpoints returns the endpoints of port p of Service svc, from every EndpointSlice
// of the Service and both address families, deduplicated by address and port and
// sorted by address then port. A slice port matches when its name and protocol equal
// the Service port's. An endpoint listed in several slices (as it is while the
// controller moves it) is taken ready if some slice says so, else from the slice
// first by name, so that the result never depends on map order.
func (s *ClusterState) Endpoints(svc *Service, p ServicePort) []Endpoint {
	var out []Endpoint
	// seen indexes out by address and port once it is too long to search.
	var seen map[netip.AddrPort]int
	find := func(k netip.AddrPort) (int, bool) {
		if seen != nil {
			i, ok := seen[k]
			return i, ok
		}
		for i := range out {
			if out[i].AddrPort() == k {
				return i, true
			}
		}
		return 0, false
	}
	bySlice := s.Slices[svc.Name]
	names := make([]string, 0, len(bySlice))
	for name := range bySlice {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		sl := bySlice[name]
		for _, sp := range sl.Ports {
			if sp.Name != p.Name || sp.Protocol != p.Protocol {
				continue
			}
			for _, e := range sl.Endpoints {
				ep := Endpoint{
					Address: e.Address, Port: sp.Port,
					Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating,
					NodeName: e.NodeName, Zone: e.Zone, ZoneHints: e.ZoneHints, NodeHints: e.NodeHints,
				}
				k := ep.AddrPort()
				if i, dup := find(k); dup {
					if ep.Ready && !out[i].Ready {
						out[i] = ep
					}
					continue
				}
				if out == nil {
					out = make([]Endpoint, 0, len(sl.Endpoints))
				}
				out = append(out, ep)
				switch {
				case seen != nil:
					seen[k] = len(out) - 1
				case len(out) > 16:
					seen = make(map[netip.AddrPort]int, 2*len(out))
					for i := range out {
						seen[out[i].AddrPort()] = i
					}
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if c := out[i].Address.Compare(out[j].Address); c != 0 {
			return c < 0
		}
		return out[i].Port < out[j].Port
	})
	return out
}

// Selection is the choice of endpoints for one Service port on one node, made as
// Kubernetes specifies it.
type Selection struct {
	// Cluster holds the endpoints for cluster-wide traffic: the ready ones (narrowed
	// by topology hints when those apply, see Topology), or, when none is ready, the
	// serving and terminating ones.
	Cluster []Endpoint
	// Local holds this node's endpoints: the ready ones, or, when none is ready, the
	// serving and terminating ones.
	Local []Endpoint
	// Internal is what ClusterIP traffic uses: Local under internalTrafficPolicy
	// Local, else Cluster.
	Internal []Endpoint
	// External is what NodePort, LoadBalancer and ExternalIP traffic from outside
	// the cluster uses: Local under externalTrafficPolicy Local, else Cluster.
	External []Endpoint
	// Any is true when some endpoint is usable for some traffic.
	Any bool
}

// Topology says which hints narrow a Service port's cluster-wide endpoints on a node.
type Topology int

// The topology modes, as kube-proxy names them after trafficDistribution.
const (
	// TopologyNone uses every ready endpoint.
	TopologyNone Topology = iota
	// TopologyPreferSameZone uses the ready endpoints hinted for the node's zone.
	TopologyPreferSameZone
	// TopologyPreferSameNode uses the ready endpoints hinted for the node.
	TopologyPreferSameNode
)

// String returns the mode's trafficDistribution name ("" for TopologyNone).
func (t Topology) String() string {
	switch t {
	case TopologyPreferSameZone:
		return "PreferSameZone"
	case TopologyPreferSameNode:
		return "PreferSameNode"
	}
	return ""
}

// Select chooses the endpoints of a Service port for node, given all its endpoints.
func Select(svc *Service, eps []Endpoint, node Node) Selection {
	mode := TopologyOf(eps, node)
	var sel Selection
	sel.Cluster = filter(eps, func(e Endpoint) bool { return e.Ready && mode.admits(e, node) })
	if len(sel.Cluster) == 0 {
		sel.Cluster = filter(eps, func(e Endpoint) bool { return e.Serving && e.Terminating })
	}
	isLocal := func(e Endpoint) bool { return node.Name != "" && e.NodeName == node.Name }
	sel.Local = filter(eps, func(e Endpoint) bool { return e.Ready && isLocal(e) })
	if len(sel.Local) == 0 {
		sel.Local = filter(eps, func(e Endpoint) bool { return e.Serving && e.Terminating && isLocal(e) })
	}
	sel.Internal, sel.External = sel.Cluster, sel.Cluster
	if svc.InternalPolicyLocal {
		sel.Internal = sel.Local
	}
	if svc.ExternalPolicyLocal {
		sel.External = sel.Local
	}
	sel.Any = len(sel.Cluster) > 0 || len(sel.Local) > 0
	return sel
}

// TopologyOf returns the topology mode of endpoints eps on node, as kube-proxy
// decides it from the hints the EndpointSlice controller writes for a Service's
// trafficDistribution (PreferSameNode sets node and zone hints, PreferSameZone and
// PreferClose zone hints, topology-aware routing zone hints): PreferSameNode when
// every ready endpoint has node hints and one names the node; else PreferSameZone
// when every ready endpoint has zone hints and one names the node's zone; else none,
// and every ready endpoint is used. So a node without a hinted endpoint falls back
// to its zone's, then to all of them, and never goes without endpoints while some
// are ready.
func TopologyOf(eps []Endpoint, node Node) Topology {
	ready, allNode, forNode, allZone, forZone := false, true, false, true, false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		ready = true
		if len(e.NodeHints) == 0 {
			allNode = false
		} else if node.Name != "" && slices.Contains(e.NodeHints, node.Name) {
			forNode = true
		}
		if len(e.ZoneHints) == 0 {
			allZone = false
		} else if node.Zone != "" && slices.Contains(e.ZoneHints, node.Zone) {
			forZone = true
		}
	}
	switch {
	case !ready:
		return TopologyNone
	case allNode && forNode:
		return TopologyPreferSameNode
	case allZone && forZone:
		return TopologyPreferSameZone
	}
	return TopologyNone
}

// admits reports whether endpoint e may take cluster-wide traffic of node under mode t.
func (t Topology) admits(e Endpoint, node Node) bool {
	switch t {
	case TopologyPreferSameNode:
		return slices.Contains(e.NodeHints, node.Name)
	case TopologyPreferSameZone:
		return slices.Contains(e.ZoneHints, node.Zone)
	}
	return true
}

// filter returns the endpoints of eps that keep accepts: eps itself when it accepts
// them all (callers only read the result).
func filter(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	n := 0
	for _, e := range eps {
		if keep(e) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if n == len(eps) {
		return eps[:n:n]
	}
	out := make([]Endpoint, 0, n)
	for _, e := range eps {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}
