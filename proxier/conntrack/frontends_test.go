package conntrack

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// randomService returns Service name with its slices, drawn from small pools of
// addresses and ports so that Services often share frontends and endpoints.
func randomService(rng *rand.Rand, name state.ServiceName) (*state.Service, map[string]*state.EndpointSlice) {
	pick := func(pool ...string) netip.Addr { return netip.MustParseAddr(pool[rng.IntN(len(pool))]) }
	svc := &state.Service{
		Name: name, Type: "LoadBalancer",
		ClusterIPs:          []netip.Addr{pick("172.30.0.1", "172.30.0.2", "172.30.0.3"), pick("fd00::1", "fd00::2")},
		ExternalPolicyLocal: rng.IntN(3) == 0,
		InternalPolicyLocal: rng.IntN(5) == 0,
	}
	if rng.IntN(2) == 0 {
		svc.ExternalIPs = []netip.Addr{pick("203.0.113.1", "203.0.113.2")}
	}
	if rng.IntN(3) == 0 {
		svc.LoadBalancerIPs = []netip.Addr{pick("198.51.100.1", "2001:db8::1")}
	}
	for i := range 1 + rng.IntN(2) {
		p := state.ServicePort{Name: fmt.Sprint("p", i), Protocol: []state.Protocol{state.UDP, state.TCP}[rng.IntN(2)], Port: uint16(53 + rng.IntN(2))}
		if rng.IntN(2) == 0 {
			p.NodePort = uint16(30053 + rng.IntN(3))
		}
		svc.Ports = append(svc.Ports, p)
	}
	byName := map[string]*state.EndpointSlice{}
	for i := range rng.IntN(3) {
		sl := &state.EndpointSlice{Name: fmt.Sprint(name.Name, "-", i), Service: name, IPv6: rng.IntN(3) == 0}
		for j := range 2 {
			sl.Ports = append(sl.Ports, state.EndpointPort{Name: fmt.Sprint("p", j), Protocol: state.UDP, Port: uint16(5353 + rng.IntN(2))})
		}
		for range rng.IntN(4) {
			a := pick("10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4")
			if sl.IPv6 {
				a = pick("fd01::1", "fd01::2")
			}
			ready := rng.IntN(4) > 0
			sl.Endpoints = append(sl.Endpoints, state.SliceEndpoint{Address: a, Ready: ready, Serving: ready || rng.IntN(2) == 0,
				Terminating: !ready, NodeName: []string{"node-a", "node-b"}[rng.IntN(2)]})
		}
		byName[sl.Name] = sl
	}
	return svc, byName
}

// randomNode returns node-a with a random set of addresses.
func randomNode(rng *rand.Rand) state.Node {
	n := state.Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.2"), netip.MustParseAddr("127.0.0.1")}}
	if rng.IntN(2) == 0 {
		n.Addresses = append(n.Addresses, netip.MustParseAddr("fd00:168::2"))
	}
	return n
}

// TestFrontendsStaleEqualsFullStale changes random Services (and now and then the
// Node) of a state whose Services share frontends and endpoints, and checks that
// Frontends.Stale, given only the changed Services of the old state, returns the
// filters Stale finds over both whole states.
func TestFrontendsStaleEqualsFullStale(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		names := make([]state.ServiceName, 10)
		for i := range names {
			names[i] = state.ServiceName{Namespace: "ns", Name: fmt.Sprint("svc-", i)}
		}
		cur := state.NewClusterState()
		cur.Node = randomNode(rng)
		fr := NewFrontends()
		var old *state.ClusterState
		nonEmpty := 0
		for step := range 100 {
			next := &state.ClusterState{Node: cur.Node, Services: maps.Clone(cur.Services), Slices: maps.Clone(cur.Slices)}
			changed := map[state.ServiceName]bool{}
			for range rng.IntN(3) {
				name := names[rng.IntN(len(names))]
				changed[name] = true
				if rng.IntN(4) == 0 {
					delete(next.Services, name)
					delete(next.Slices, name)
					continue
				}
				next.Services[name], next.Slices[name] = randomService(rng, name)
			}
			if rng.IntN(15) == 0 {
				next.Node = randomNode(rng)
				for _, n := range names {
					changed[n] = true
				}
			}
			// What the previous state had of the changed Services, as the
			// proxier keeps it.
			var prior *state.ClusterState
			if old != nil {
				prior = &state.ClusterState{Node: cur.Node, Services: map[state.ServiceName]*state.Service{}, Slices: map[state.ServiceName]map[string]*state.EndpointSlice{}}
				for name := range changed {
					if svc, ok := cur.Services[name]; ok {
						prior.Services[name] = svc
					}
					if sl, ok := cur.Slices[name]; ok {
						prior.Slices[name] = sl
					}
				}
			}
			want := Stale(old, next)
			got := fr.Stale(prior, next, changed)
			if !slices.Equal(want, got) {
				t.Fatalf("seed %d step %d: incremental filters\n%v\nwant\n%v", seed, step, got, want)
			}
			if len(want) > 0 {
				nonEmpty++
			}
			old, cur = next, next
		}
		if nonEmpty < 10 {
			t.Errorf("seed %d: only %d steps had stale entries", seed, nonEmpty)
		}
	}
}
