package syncer

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestKernelAffinityMoves checks, on a real kernel, that the affinity records of a
// frontend follow their endpoint when the endpoint list shifts, are deleted with
// their endpoint, keep the Service's timeout, and that a restarted Syncer fixes the
// records a previous one left; records of other frontends stay.
func TestKernelAffinityMoves(t *testing.T) {
	ns, nft := kernelNFT(t, "affinity")
	ctx := context.Background()

	name := state.ServiceName{Namespace: "ns", Name: "sticky"}
	st := state.NewClusterState()
	st.Node = testNode()
	st.Services[name] = &state.Service{
		Name: name, Type: "ClusterIP", AffinityTimeout: 90 * time.Second,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("172.30.0.10")},
		Ports:      []state.ServicePort{{Name: "http", Protocol: state.TCP, Port: 80}},
	}
	endpoints := func(addrs ...string) {
		sl := &state.EndpointSlice{Name: "sticky-abc", Service: name,
			Ports: []state.EndpointPort{{Name: "http", Protocol: state.TCP, Port: 8080}}}
		for _, a := range addrs {
			sl.Endpoints = append(sl.Endpoints, state.SliceEndpoint{Address: netip.MustParseAddr(a), Ready: true, Serving: true, NodeName: "node-b"})
		}
		st.Slices[name] = map[string]*state.EndpointSlice{sl.Name: sl}
	}
	changed := map[state.ServiceName]bool{name: true}
	endpoints("10.1.0.5", "10.2.0.6")
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	s := New(nft)
	rs, d := b.Update(st, nil)
	if _, err := s.Apply(ctx, rs, d); err != nil {
		t.Fatal(err)
	}
	// Clients as the data path records them: .1 was sent to endpoint 0 (10.1.0.5),
	// .2 to endpoint 1 (10.2.0.6); .3 is a client of another frontend.
	tx := nft.NewTransaction()
	for _, r := range [][2]string{{"0", "10.9.0.1 . 172.30.0.10"}, {"1", "10.9.0.2 . 172.30.0.10"}, {"0", "10.9.0.3 . 172.30.0.99"}} {
		tx.Add(&knftables.Element{Set: ruleset.SetAffinityClients + r[0], Key: append(strings.Split(r[1], " . "), "tcp", "80")})
	}
	if err := nft.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	records := func() map[string][]string {
		t.Helper()
		out := map[string][]string{}
		sets, err := nft.List(ctx, "sets")
		if err != nil {
			t.Fatal(err)
		}
		for _, set := range sets {
			if !strings.HasPrefix(set, ruleset.SetAffinityClients) {
				continue
			}
			es, err := nft.ListElements(ctx, "set", set)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				out[set] = append(out[set], e.Key[0]+" . "+e.Key[1])
			}
			slices.Sort(out[set])
		}
		return out
	}

	// A new endpoint sorting first shifts the others up: so do their records.
	endpoints("10.0.0.4", "10.1.0.5", "10.2.0.6")
	rs, d = b.Update(st, changed)
	res, err := s.Apply(ctx, rs, d)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.AffinityMoves) != 2 {
		t.Errorf("Result.AffinityMoves = %v, want 2 moves", res.AffinityMoves)
	}
	want := map[string][]string{
		"affinity-clients-0": {"10.9.0.3 . 172.30.0.99"},
		"affinity-clients-1": {"10.9.0.1 . 172.30.0.10"},
		"affinity-clients-2": {"10.9.0.2 . 172.30.0.10"},
	}
	if diff := cmp.Diff(want, records()); diff != "" {
		t.Errorf("records after an endpoint was added (-want +got):\n%s", diff)
	}
	// A moved record carries the Service's timeout (90s), not the set's (3h).
	out, err := ns.Exec(ctx, "", "nft", "list", "set", "ip", testConfig.Table, "affinity-clients-1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "timeout 1m30s") {
		t.Errorf("moved record without the Service's 90s timeout:\n%s", out)
	}

	// Removing 10.1.0.5 deletes its client's record and moves 10.2.0.6's down.
	endpoints("10.0.0.4", "10.2.0.6")
	rs, d = b.Update(st, changed)
	if _, err := s.Apply(ctx, rs, d); err != nil {
		t.Fatal(err)
	}
	want = map[string][]string{
		"affinity-clients-0": {"10.9.0.3 . 172.30.0.99"},
		"affinity-clients-1": {"10.9.0.2 . 172.30.0.10"},
	}
	if diff := cmp.Diff(want, records()); diff != "" {
		t.Errorf("records after an endpoint was removed (-want +got):\n%s", diff)
	}

	// A restarted proxier, which finds the endpoints changed meanwhile, reads the
	// old affinity maps from the kernel and moves the records the same way.
	endpoints("10.2.0.6")
	b2 := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	rs, d = b2.Update(st, nil)
	if _, err := New(nft).Apply(ctx, rs, d); err != nil {
		t.Fatal(err)
	}
	want = map[string][]string{
		"affinity-clients-0": {"10.9.0.2 . 172.30.0.10", "10.9.0.3 . 172.30.0.99"},
	}
	if diff := cmp.Diff(want, records()); diff != "" {
		t.Errorf("records after a restart (-want +got):\n%s", diff)
	}
}
