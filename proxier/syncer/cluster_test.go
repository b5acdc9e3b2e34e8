package syncer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// The tests in this file drive the Syncer with rulesets built by the real builder
// from generated clusters.

var testConfig = func() ruleset.Config {
	c := ruleset.Config{
		LocalMode:    ruleset.LocalClusterCIDR,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/16")},
	}
	c.Defaults()
	return c
}()

func testNode() state.Node {
	return state.Node{Name: "node-a", Zone: "z1", Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.10")}}
}

// genService returns Service i with n endpoints, varied over types and policies.
func genService(st *state.ClusterState, i, n int, r *rand.Rand) {
	name := state.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
	svc := &state.Service{
		Name:       name,
		Type:       "ClusterIP",
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{172, 30, byte(i / 250), byte(i%250 + 1)})},
		Ports:      []state.ServicePort{{Name: "http", Protocol: state.TCP, Port: 80}},
	}
	kind := i % 10
	if r != nil {
		kind = r.IntN(10)
	}
	switch {
	case kind >= 9:
		svc.Type = "LoadBalancer"
		svc.Ports[0].NodePort = uint16(30000 + i%2000)
		svc.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, byte(i / 250), byte(i%250 + 1)})}
		svc.ExternalPolicyLocal = true
		svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	case kind >= 7:
		svc.Type = "NodePort"
		svc.Ports[0].NodePort = uint16(30000 + i%2000)
	case kind == 6:
		svc.AffinityTimeout = 3 * time.Hour
	case kind == 5:
		svc.InternalPolicyLocal = true
	}
	st.Services[name] = svc
	setEndpoints(st, name, i, n)
}

func setEndpoints(st *state.ClusterState, name state.ServiceName, i, n int) {
	sl := &state.EndpointSlice{Name: name.Name + "-abc", Service: name,
		Ports: []state.EndpointPort{{Name: "http", Protocol: state.TCP, Port: 8080}}}
	for j := range n {
		node := "node-b"
		if j%2 == 0 {
			node = "node-a"
		}
		sl.Endpoints = append(sl.Endpoints, state.SliceEndpoint{
			Address: netip.AddrFrom4([4]byte{10, byte(1 + j), byte(i / 250), byte(i%250 + 1)}),
			Ready:   true, Serving: true, NodeName: node,
		})
	}
	st.Slices[name] = map[string]*state.EndpointSlice{sl.Name: sl}
}

func cluster(n int) *state.ClusterState {
	st := state.NewClusterState()
	st.Node = testNode()
	// Endpoint counts vary as in a real cluster, so the shared dnat-N chains for
	// small N already exist when one Service changes.
	for i := range n {
		genService(st, i, 1+(i/10)%5, nil)
	}
	return st
}

func clone(st *state.ClusterState) *state.ClusterState {
	c := state.NewClusterState()
	c.Node = st.Node
	for k, v := range st.Services {
		c.Services[k] = v
	}
	for k, v := range st.Slices {
		c.Slices[k] = v
	}
	return c
}

func TestOneServiceChangeAt1000Services(t *testing.T) {
	st := cluster(1000)
	f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	s := New(f)
	if res := mustSync(t, s, ruleset.Build(st, testConfig, knftables.IPv4Family)); !res.Full {
		t.Fatalf("first sync not full")
	}
	// Service i has kind i%10 (see genService) and 1+(i/10)%5 endpoints.
	for _, tc := range []struct {
		name  string
		svc   int
		delta int
	}{
		{"ClusterIP endpoint added", 10, +1},
		{"ClusterIP endpoint removed", 21, -1},
		{"NodePort endpoint added", 17, +1},
		{"LoadBalancer ETP Local endpoint added", 29, +1},
		{"LoadBalancer ETP Local endpoint removed", 49, -1},
		{"affinity endpoint added", 16, +1},
		{"ITP Local endpoint added", 15, +1},
		{"last endpoint gone", 3, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st = clone(st)
			name := state.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", tc.svc)}
			n := 1 + (tc.svc/10)%5
			setEndpoints(st, name, tc.svc, n+tc.delta)
			want := ruleset.Build(st, testConfig, knftables.IPv4Family)
			res := mustSync(t, s, want)
			ops := f.LastTransaction.NumOperations()
			if res.Full || ops > 20 || ops == 0 {
				t.Errorf("full=%v, %d operations; want an incremental transaction of 1..20 operations:\n%s", res.Full, ops, f.LastTransaction)
			}
			t.Logf("%d operations", ops)
			if diff := cmp.Diff(fresh(t, want), canonical(f.Dump())); diff != "" {
				t.Errorf("dump differs from a full sync (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDeletingAServiceRemovesEverythingItHad(t *testing.T) {
	for _, i := range []int{0, 5, 6, 7, 9} { // ClusterIP, ITP Local, affinity, NodePort, LB ETP Local
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			st := cluster(20)
			f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
			s := New(f)
			mustSync(t, s, ruleset.Build(st, testConfig, knftables.IPv4Family))
			svc := st.Services[state.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}]
			var needles []string
			for _, a := range svc.ClusterIPs {
				needles = append(needles, a.String()+" ")
			}
			for _, a := range svc.LoadBalancerIPs {
				needles = append(needles, a.String()+" ")
			}
			for _, sl := range st.Slices[svc.Name] {
				for _, e := range sl.Endpoints {
					needles = append(needles, e.Address.String()+" ")
				}
			}
			needles = append(needles, "ns/svc-"+fmt.Sprint(i)+"/")
			if svc.Ports[0].NodePort != 0 {
				needles = append(needles, fmt.Sprintf(" . %d ", svc.Ports[0].NodePort))
			}
			before := f.Dump()
			for _, n := range needles {
				if !strings.Contains(before, n) {
					t.Fatalf("before deletion the dump lacks %q; the test's needles are wrong", n)
				}
			}
			delete(st.Services, svc.Name)
			delete(st.Slices, svc.Name)
			mustSync(t, s, ruleset.Build(st, testConfig, knftables.IPv4Family))
			after := f.Dump()
			for _, n := range needles {
				if strings.Contains(after, n) {
					t.Errorf("after deleting %s the dump still contains %q", svc.Name, n)
				}
			}
		})
	}
}

func TestPropertyClusterChurnEqualsFullSync(t *testing.T) {
	for seed := range uint64(12) {
		r := rand.New(rand.NewPCG(seed, 99))
		st := cluster(30)
		f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
		s := New(f, WithKeepLimit(0))
		for step := range 40 {
			st, _ = churnStep(st, r, false)
			want := ruleset.Build(st, testConfig, knftables.IPv4Family)
			if _, err := s.Sync(context.Background(), want); err != nil {
				t.Fatalf("seed %d step %d: %v\n%s", seed, step, err, f.LastTransaction)
			}
			if diff := cmp.Diff(fresh(t, want), canonical(f.Dump())); diff != "" {
				t.Fatalf("seed %d step %d: incremental dump differs from a full sync (-want +got):\n%s", seed, step, diff)
			}
		}
	}
}

// churnStep applies one random change to a copy of st — a Service deleted, its
// endpoints changed, or a Service (re)created; with conflicts, some Services claim a
// shared ExternalIP and node port — and returns it with the Service changed.
func churnStep(st *state.ClusterState, r *rand.Rand, conflicts bool) (*state.ClusterState, state.ServiceName) {
	st = clone(st)
	i := r.IntN(40)
	name := state.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
	switch r.IntN(5) {
	case 0:
		delete(st.Services, name)
		delete(st.Slices, name)
	case 1:
		if _, ok := st.Services[name]; ok {
			setEndpoints(st, name, i, r.IntN(5))
		}
	case 2:
		genService(st, i, r.IntN(4), r)
		if conflicts {
			svc := *st.Services[name]
			svc.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
			svc.Ports = []state.ServicePort{{Name: "http", Protocol: state.TCP, Port: 80, NodePort: 31999}}
			svc.Type = "NodePort"
			st.Services[name] = &svc
		}
	default:
		genService(st, i, r.IntN(5), r)
	}
	return st, name
}
