package state

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ep describes an endpoint compactly: "10.1.0.5 node-a z1 ready hints=z1,z2
// nodehints=node-a"; the words after the address are a node name (node-*), a zone
// (z*), the conditions ready, serving and terminating, zone hints and node hints.
func ep(desc string) Endpoint {
	f := strings.Fields(desc)
	e := Endpoint{Address: netip.MustParseAddr(f[0]), Port: 8080}
	for _, w := range f[1:] {
		switch {
		case strings.HasPrefix(w, "node-"):
			e.NodeName = w
		case strings.HasPrefix(w, "z"):
			e.Zone = w
		case w == "ready":
			e.Ready, e.Serving = true, true
		case w == "serving":
			e.Serving = true
		case w == "terminating":
			e.Terminating = true
		case strings.HasPrefix(w, "hints="):
			e.ZoneHints = strings.Split(strings.TrimPrefix(w, "hints="), ",")
		case strings.HasPrefix(w, "nodehints="):
			e.NodeHints = strings.Split(strings.TrimPrefix(w, "nodehints="), ",")
		default:
			panic("bad endpoint word " + w)
		}
	}
	return e
}

// addrsOf returns the addresses of eps, for readable comparisons.
func addrsOf(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Address.String())
	}
	return out
}

func TestSelect(t *testing.T) {
	nodeA := Node{Name: "node-a", Zone: "z1"}
	plain := &Service{}
	itp := &Service{InternalPolicyLocal: true}
	etp := &Service{ExternalPolicyLocal: true}
	tests := []struct {
		name string
		svc  *Service
		node Node
		eps  []string
		// want* are the addresses chosen, nil for none.
		wantCluster, wantLocal, wantInternal, wantExternal []string
		wantAny                                            bool
	}{
		{
			name: "ready endpoints everywhere",
			svc:  plain, node: nodeA,
			eps:         []string{"10.1.0.5 node-a ready", "10.2.0.5 node-b ready"},
			wantCluster: []string{"10.1.0.5", "10.2.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.1.0.5", "10.2.0.5"}, wantExternal: []string{"10.1.0.5", "10.2.0.5"},
			wantAny: true,
		},
		{
			name: "ready ones win over terminating ones",
			svc:  plain, node: nodeA,
			eps:         []string{"10.1.0.5 node-a serving terminating", "10.2.0.5 node-b ready"},
			wantCluster: []string{"10.2.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.2.0.5"}, wantExternal: []string{"10.2.0.5"},
			wantAny: true,
		},
		{
			name: "no ready endpoint: serving terminating ones, not the non-serving",
			svc:  plain, node: nodeA,
			eps:         []string{"10.1.0.5 node-a terminating", "10.2.0.5 node-b serving terminating", "10.2.0.6 node-b"},
			wantCluster: []string{"10.2.0.5"}, wantLocal: nil,
			wantInternal: []string{"10.2.0.5"}, wantExternal: []string{"10.2.0.5"},
			wantAny: true,
		},
		{
			name: "serving but not terminating is no fallback",
			svc:  plain, node: nodeA,
			eps:     []string{"10.1.0.5 node-a serving", "10.2.0.5 node-b"},
			wantAny: false,
		},
		{
			name: "no endpoints",
			svc:  plain, node: nodeA,
			wantAny: false,
		},
		{
			name: "internalTrafficPolicy Local",
			svc:  itp, node: nodeA,
			eps:         []string{"10.1.0.5 node-a ready", "10.2.0.5 node-b ready"},
			wantCluster: []string{"10.1.0.5", "10.2.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.1.0.5"}, wantExternal: []string{"10.1.0.5", "10.2.0.5"},
			wantAny: true,
		},
		{
			name: "internalTrafficPolicy Local without local endpoints",
			svc:  itp, node: nodeA,
			eps:         []string{"10.2.0.5 node-b ready"},
			wantCluster: []string{"10.2.0.5"}, wantLocal: nil,
			wantInternal: nil, wantExternal: []string{"10.2.0.5"},
			wantAny: true,
		},
		{
			name: "externalTrafficPolicy Local",
			svc:  etp, node: nodeA,
			eps:         []string{"10.1.0.5 node-a ready", "10.1.0.6 node-a", "10.2.0.5 node-b ready"},
			wantCluster: []string{"10.1.0.5", "10.2.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.1.0.5", "10.2.0.5"}, wantExternal: []string{"10.1.0.5"},
			wantAny: true,
		},
		{
			name: "local fallback to terminating while remote ones are ready",
			svc:  etp, node: nodeA,
			eps:         []string{"10.1.0.5 node-a serving terminating", "10.2.0.5 node-b ready"},
			wantCluster: []string{"10.2.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.2.0.5"}, wantExternal: []string{"10.1.0.5"},
			wantAny: true,
		},
		{
			name: "only local endpoints that are not serving",
			svc:  etp, node: nodeA,
			eps:     []string{"10.1.0.5 node-a terminating"},
			wantAny: false,
		},
		{
			name: "no local endpoints for a node without name",
			svc:  etp, node: Node{},
			eps:         []string{"10.1.0.5 ready"},
			wantCluster: []string{"10.1.0.5"}, wantInternal: []string{"10.1.0.5"},
			wantAny: true,
		},
		{
			name: "topology hints narrow the cluster endpoints",
			svc:  plain, node: nodeA,
			eps:         []string{"10.1.0.5 node-a ready hints=z1", "10.2.0.5 node-b ready hints=z2", "10.2.0.6 node-b ready hints=z2,z1"},
			wantCluster: []string{"10.1.0.5", "10.2.0.6"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.1.0.5", "10.2.0.6"}, wantExternal: []string{"10.1.0.5", "10.2.0.6"},
			wantAny: true,
		},
		{
			name: "topology hints ignored when a ready endpoint has none",
			svc:  plain, node: nodeA,
			eps:         []string{"10.1.0.5 node-a ready hints=z1", "10.2.0.5 node-b ready"},
			wantCluster: []string{"10.1.0.5", "10.2.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.1.0.5", "10.2.0.5"}, wantExternal: []string{"10.1.0.5", "10.2.0.5"},
			wantAny: true,
		},
		{
			name: "topology hints ignored when none names the zone",
			svc:  plain, node: nodeA,
			eps:         []string{"10.1.0.5 node-a ready hints=z3", "10.2.0.5 node-b ready hints=z2"},
			wantCluster: []string{"10.1.0.5", "10.2.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.1.0.5", "10.2.0.5"}, wantExternal: []string{"10.1.0.5", "10.2.0.5"},
			wantAny: true,
		},
		{
			name: "topology hints ignored on a node without zone",
			svc:  plain, node: Node{Name: "node-a"},
			eps:         []string{"10.1.0.5 node-a ready hints=z1", "10.2.0.5 node-b ready hints=z2"},
			wantCluster: []string{"10.1.0.5", "10.2.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.1.0.5", "10.2.0.5"}, wantExternal: []string{"10.1.0.5", "10.2.0.5"},
			wantAny: true,
		},
		{
			name: "topology hints: endpoints that are not ready need none",
			svc:  plain, node: nodeA,
			eps:         []string{"10.1.0.5 node-a ready hints=z1", "10.2.0.5 node-b ready hints=z2", "10.2.0.6 node-b serving terminating"},
			wantCluster: []string{"10.1.0.5"}, wantLocal: []string{"10.1.0.5"},
			wantInternal: []string{"10.1.0.5"}, wantExternal: []string{"10.1.0.5"},
			wantAny: true,
		},
		{
			name: "topology hints do not narrow local endpoints",
			svc:  itp, node: Node{Name: "node-b", Zone: "z1"},
			eps:         []string{"10.1.0.5 node-a ready hints=z1", "10.2.0.5 node-b ready hints=z2"},
			wantCluster: []string{"10.1.0.5"}, wantLocal: []string{"10.2.0.5"},
			wantInternal: []string{"10.2.0.5"}, wantExternal: []string{"10.1.0.5"},
			wantAny: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var eps []Endpoint
			for _, d := range tt.eps {
				eps = append(eps, ep(d))
			}
			sel := Select(tt.svc, eps, tt.node)
			for _, c := range []struct {
				what      string
				want, got []string
			}{
				{"Cluster", tt.wantCluster, addrsOf(sel.Cluster)},
				{"Local", tt.wantLocal, addrsOf(sel.Local)},
				{"Internal", tt.wantInternal, addrsOf(sel.Internal)},
				{"External", tt.wantExternal, addrsOf(sel.External)},
			} {
				if diff := cmp.Diff(c.want, c.got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", c.what, diff)
				}
			}
			if sel.Any != tt.wantAny {
				t.Errorf("Any = %v, want %v", sel.Any, tt.wantAny)
			}
		})
	}
}

func TestEndpoints(t *testing.T) {
	name := ServiceName{Namespace: "default", Name: "dns"}
	svc := &Service{Name: name, Ports: []ServicePort{{Name: "dns", Protocol: UDP, Port: 53}, {Name: "dns-tcp", Protocol: TCP, Port: 53}}}
	se := func(addr string, ready bool) SliceEndpoint {
		return SliceEndpoint{Address: netip.MustParseAddr(addr), Ready: ready, Serving: ready, NodeName: "node-a"}
	}
	st := NewClusterState()
	st.Services[name] = svc
	st.Slices[name] = map[string]*EndpointSlice{
		"dns-b": {
			Name: "dns-b", Service: name,
			Ports:     []EndpointPort{{Name: "dns", Protocol: UDP, Port: 5353}, {Name: "dns-tcp", Protocol: TCP, Port: 53}},
			Endpoints: []SliceEndpoint{se("10.2.0.2", true), se("10.1.0.2", true), se("10.1.0.3", true)},
		},
		// While the controller moves 10.1.0.3 it is listed twice, once not ready.
		"dns-a": {
			Name: "dns-a", Service: name,
			Ports:     []EndpointPort{{Name: "dns", Protocol: UDP, Port: 5353}, {Name: "dns", Protocol: TCP, Port: 9999}},
			Endpoints: []SliceEndpoint{se("10.1.0.3", false), se("10.1.0.4", false)},
		},
		"dns-v6": {
			Name: "dns-v6", Service: name, IPv6: true,
			Ports:     []EndpointPort{{Name: "dns", Protocol: UDP, Port: 5353}},
			Endpoints: []SliceEndpoint{se("fd00:1::2", true)},
		},
	}
	got := st.Endpoints(svc, svc.Ports[0])
	var desc []string
	for _, e := range got {
		desc = append(desc, e.AddrPort().String()+map[bool]string{true: " ready", false: ""}[e.Ready])
	}
	want := []string{"10.1.0.2:5353 ready", "10.1.0.3:5353 ready", "10.1.0.4:5353", "10.2.0.2:5353 ready", "[fd00:1::2]:5353 ready"}
	if diff := cmp.Diff(want, desc); diff != "" {
		t.Errorf("Endpoints(dns/udp) (-want +got):\n%s", diff)
	}
	if got[0].NodeName != "node-a" || !got[0].Serving {
		t.Errorf("Endpoints lost the endpoint's fields: %+v", got[0])
	}

	// The TCP port named dns-tcp matches only dns-b's port; dns-a's "dns"/TCP port
	// matches no Service port.
	desc = nil
	for _, e := range st.Endpoints(svc, svc.Ports[1]) {
		desc = append(desc, e.AddrPort().String())
	}
	want = []string{"10.1.0.2:53", "10.1.0.3:53", "10.2.0.2:53"}
	if diff := cmp.Diff(want, desc); diff != "" {
		t.Errorf("Endpoints(dns-tcp/tcp) (-want +got):\n%s", diff)
	}

	if eps := st.Endpoints(&Service{Name: ServiceName{Namespace: "default", Name: "none"}}, svc.Ports[0]); len(eps) != 0 {
		t.Errorf("Endpoints of a Service without slices = %v, want none", eps)
	}
}

// TestTopologyOf follows kube-proxy's topologyModeFromHints: node hints first, then
// zone hints, each only when every ready endpoint has them and one names this node
// (zone); otherwise every ready endpoint.
func TestTopologyOf(t *testing.T) {
	nodeA := Node{Name: "node-a", Zone: "z1"}
	tests := []struct {
		name        string
		node        Node
		eps         []string
		want        Topology
		wantCluster []string
	}{
		{
			name: "PreferSameNode: node hints name the node",
			node: nodeA,
			eps: []string{
				"10.1.0.5 node-a z1 ready hints=z1 nodehints=node-a",
				"10.1.0.6 node-c z1 ready hints=z1 nodehints=node-c",
				"10.2.0.5 node-b z2 ready hints=z2 nodehints=node-b",
			},
			want: TopologyPreferSameNode, wantCluster: []string{"10.1.0.5"},
		},
		{
			name: "PreferSameNode without an endpoint for the node falls back to the zone",
			node: nodeA,
			eps: []string{
				"10.1.0.6 node-c z1 ready hints=z1 nodehints=node-c",
				"10.2.0.5 node-b z2 ready hints=z2 nodehints=node-b",
			},
			want: TopologyPreferSameZone, wantCluster: []string{"10.1.0.6"},
		},
		{
			name: "and to every endpoint when the zone has none either",
			node: nodeA,
			eps: []string{
				"10.2.0.5 node-b z2 ready hints=z2 nodehints=node-b",
				"10.3.0.5 node-c z3 ready hints=z3 nodehints=node-c",
			},
			want: TopologyNone, wantCluster: []string{"10.2.0.5", "10.3.0.5"},
		},
		{
			name: "a ready endpoint without node hints disables them, zone hints still apply",
			node: nodeA,
			eps: []string{
				"10.1.0.5 node-a z1 ready hints=z1 nodehints=node-a",
				"10.1.0.6 node-c z1 ready hints=z1",
				"10.2.0.5 node-b z2 ready hints=z2 nodehints=node-b",
			},
			want: TopologyPreferSameZone, wantCluster: []string{"10.1.0.5", "10.1.0.6"},
		},
		{
			name: "node hints only, without zone hints",
			node: nodeA,
			eps: []string{
				"10.1.0.5 node-a z1 ready nodehints=node-a",
				"10.2.0.5 node-b z2 ready nodehints=node-b",
			},
			want: TopologyPreferSameNode, wantCluster: []string{"10.1.0.5"},
		},
		{
			name: "node hints work on a node without a zone",
			node: Node{Name: "node-a"},
			eps: []string{
				"10.1.0.5 node-a ready hints=z1 nodehints=node-a",
				"10.2.0.5 node-b ready hints=z2 nodehints=node-b",
			},
			want: TopologyPreferSameNode, wantCluster: []string{"10.1.0.5"},
		},
		{
			name: "not-ready endpoints neither need hints nor are chosen",
			node: nodeA,
			eps: []string{
				"10.1.0.5 node-a z1 ready nodehints=node-a",
				"10.1.0.7 node-a z1 serving terminating",
				"10.2.0.5 node-b z2 ready nodehints=node-b",
			},
			want: TopologyPreferSameNode, wantCluster: []string{"10.1.0.5"},
		},
		{
			name: "no ready endpoint: no topology, the terminating fallback is not narrowed",
			node: nodeA,
			eps: []string{
				"10.1.0.5 node-c z1 serving terminating nodehints=node-c",
				"10.2.0.5 node-b z2 serving terminating nodehints=node-b",
			},
			want: TopologyNone, wantCluster: []string{"10.1.0.5", "10.2.0.5"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var eps []Endpoint
			for _, d := range tt.eps {
				eps = append(eps, ep(d))
			}
			if got := TopologyOf(eps, tt.node); got != tt.want {
				t.Errorf("TopologyOf = %q, want %q", got, tt.want)
			}
			sel := Select(&Service{}, eps, tt.node)
			if diff := cmp.Diff(tt.wantCluster, addrsOf(sel.Cluster)); diff != "" {
				t.Errorf("Cluster (-want +got):\n%s", diff)
			}
		})
	}
}
