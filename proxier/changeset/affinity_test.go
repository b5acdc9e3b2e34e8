package changeset

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

func TestAffinityMoves(t *testing.T) {
	st := fixture.NewCluster()
	svc := fixture.AddService(st, "default/web", "172.30.0.10", fixture.Affinity(90*time.Second), fixture.NodePortType, fixture.Ports(fixture.TCP("http", 80, 30080)))
	setEPs := func(eps ...state.SliceEndpoint) {
		st.Slices[svc.Name] = nil
		fixture.AddSlice(st, svc, "web-1", fixture.Targets(svc, 8080), eps...)
	}
	setEPs(fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
	b := NewBuilder(baseConfig(), knftables.IPv4Family)
	b.Update(st, nil)
	changed := map[state.ServiceName]bool{svc.Name: true}
	frontend := []string{"172.30.0.10", "tcp", "80"}
	nodePort := []string{"tcp", "30080"}

	// A new endpoint that sorts first shifts the others up by one.
	setEPs(fixture.Endpoint("10.0.0.4", "node-b"), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
	rs, delta := b.Update(st, changed)
	want := []AffinityMove{
		{Frontend: frontend, From: "affinity-clients-0", To: "affinity-clients-1", Timeout: "90"},
		{Frontend: frontend, From: "affinity-clients-1", To: "affinity-clients-2", Timeout: "90"},
		{Frontend: nodePort, NodePort: true, From: "affinity-clients-0", To: "affinity-clients-1", Timeout: "90"},
		{Frontend: nodePort, NodePort: true, From: "affinity-clients-1", To: "affinity-clients-2", Timeout: "90"},
	}
	if diff := cmp.Diff(want, AffinityMoves(rs, delta)); diff != "" {
		t.Errorf("moves after adding an endpoint (-want +got):\n%s", diff)
	}

	// Removing the middle endpoint deletes its records and moves the last one's down.
	setEPs(fixture.Endpoint("10.0.0.4", "node-b"), fixture.Endpoint("10.2.0.6", "node-b"))
	rs, delta = b.Update(st, changed)
	want = []AffinityMove{
		{Frontend: frontend, From: "affinity-clients-1", Timeout: "90"},
		{Frontend: frontend, From: "affinity-clients-2", To: "affinity-clients-1", Timeout: "90"},
		{Frontend: nodePort, NodePort: true, From: "affinity-clients-1", Timeout: "90"},
		{Frontend: nodePort, NodePort: true, From: "affinity-clients-2", To: "affinity-clients-1", Timeout: "90"},
	}
	if diff := cmp.Diff(want, AffinityMoves(rs, delta)); diff != "" {
		t.Errorf("moves after removing an endpoint (-want +got):\n%s", diff)
	}

	// A change elsewhere moves nothing.
	other := fixture.AddService(st, "default/other", "172.30.0.11", fixture.Ports(fixture.TCP("http", 80, 0)))
	fixture.AddSlice(st, other, "other-1", fixture.Targets(other, 8080), fixture.Endpoint("10.1.0.9", fixture.NodeName))
	rs, delta = b.Update(st, map[state.ServiceName]bool{other.Name: true})
	if got := AffinityMoves(rs, delta); len(got) != 0 {
		t.Errorf("moves after a change to a Service without affinity = %v, want none", got)
	}

	// Deleting the Service deletes every record.
	delete(st.Services, svc.Name)
	delete(st.Slices, svc.Name)
	rs, delta = b.Update(st, changed)
	got := AffinityMoves(rs, delta)
	if len(got) != 4 {
		t.Fatalf("moves after deleting the Service = %v, want 4 deletions", got)
	}
	for _, m := range got {
		if m.To != "" {
			t.Errorf("move %+v after deleting the Service, want a deletion", m)
		}
	}
}

func TestAffinityMoveMatches(t *testing.T) {
	nodeIPs := map[string]bool{"192.168.0.10": true}
	addr := AffinityMove{Frontend: []string{"172.30.0.10", "tcp", "80"}}
	np := AffinityMove{Frontend: []string{"tcp", "80"}, NodePort: true}
	for _, tc := range []struct {
		m      *AffinityMove
		record []string
		want   bool
	}{
		{&addr, []string{"10.1.0.5", "172.30.0.10", "tcp", "80"}, true},
		{&addr, []string{"10.1.0.5", "172.30.0.11", "tcp", "80"}, false},
		{&addr, []string{"10.1.0.5", "172.30.0.10", "udp", "80"}, false},
		{&np, []string{"10.1.0.5", "192.168.0.10", "tcp", "80"}, true},
		// The same port on a ClusterIP is not the node port's.
		{&np, []string{"10.1.0.5", "172.30.0.10", "tcp", "80"}, false},
		{&np, []string{"10.1.0.5", "192.168.0.10"}, false},
	} {
		if got := tc.m.Matches(tc.record, nodeIPs); got != tc.want {
			t.Errorf("%v.Matches(%v) = %v, want %v", tc.m.Frontend, tc.record, got, tc.want)
		}
	}
}
