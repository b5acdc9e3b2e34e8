package state

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// sameState reports how a and b differ (nil when they hold the same Node,
// ServiceCIDRs, Services and slices, compared by pointer as the Tracker shares
// them).
func sameState(a, b *ClusterState) error {
	switch {
	case !maps.Equal(a.Services, b.Services):
		return fmt.Errorf("Services differ")
	case !maps.EqualFunc(a.Slices, b.Slices, maps.Equal):
		return fmt.Errorf("slices differ")
	case fmt.Sprint(a.Node) != fmt.Sprint(b.Node):
		return fmt.Errorf("Node %v, want %v", a.Node, b.Node)
	case fmt.Sprint(a.ServiceCIDRs) != fmt.Sprint(b.ServiceCIDRs):
		return fmt.Errorf("ServiceCIDRs %v, want %v", a.ServiceCIDRs, b.ServiceCIDRs)
	}
	return nil
}

// randomChange makes one random change to tr: a Service or slice updated or
// deleted, the Node or a ServiceCIDR changed.
func randomChange(t *testing.T, tr *Tracker, rng *rand.Rand) {
	name := fmt.Sprintf("svc-%d", rng.IntN(12))
	switch rng.IntN(10) {
	case 0, 1, 2:
		mustNil(t, tr.UpdateService(named(name, func(s *v1.Service) { s.Spec.Ports[0].Port = int32(80 + rng.IntN(3)) })))
	case 3:
		tr.DeleteService(named(name))
	case 4, 5, 6:
		slice := sliceOf(fmt.Sprintf("%s-%d", name, rng.IntN(2)), name, func(s *discoveryv1.EndpointSlice) {
			s.Endpoints[0].Addresses = []string{fmt.Sprintf("10.1.0.%d", 1+rng.IntN(3))}
		})
		mustNil(t, tr.UpdateEndpointSlice(slice))
	case 7:
		tr.DeleteEndpointSlice(sliceOf(fmt.Sprintf("%s-%d", name, rng.IntN(2)), name))
	case 8:
		mustNil(t, tr.UpdateNode(testNode(func(n *v1.Node) { n.Labels[v1.LabelTopologyZone] = fmt.Sprint("z", rng.IntN(2)) })))
	default:
		mustNil(t, tr.UpdateServiceCIDR(serviceCIDR("extra", fmt.Sprintf("172.%d.0.0/16", 30+rng.IntN(2)))))
	}
}

// TestTrackerTakeStateProperty checks, over random changes and takes that release
// their state or not, that every take's state equals a fresh copy of the
// Tracker's (as State returns), that Changed names every Service that differs from
// the previous take's state and Prior holds what that state had of them, and that
// Modified is false only when nothing differs.
func TestTrackerTakeStateProperty(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		tr := NewTracker("node-a")
		var prev *ClusterState // a copy of the previous take's state
		var inPlace int
		for range 200 {
			for range rng.IntN(4) {
				randomChange(t, tr, rng)
			}
			tk := tr.TakeState()
			if err := sameState(tk.State, tr.State()); err != nil {
				t.Fatalf("seed %d: taken state is not the Tracker's: %v", seed, err)
			}
			if prev != nil {
				checkTaken(t, seed, prev, tk)
			}
			if tk.Prior != nil && tk.Prior != prev && len(tk.Prior.Services) < len(tk.State.Services) {
				inPlace++
			}
			prev = &ClusterState{Node: tk.State.Node, ServiceCIDRs: tk.State.ServiceCIDRs,
				Services: maps.Clone(tk.State.Services), Slices: maps.Clone(tk.State.Slices)}
			if rng.IntN(4) > 0 {
				tr.Release(tk.State)
			}
		}
		if inPlace == 0 {
			t.Errorf("seed %d: no take was made in place", seed)
		}
	}
}

// checkTaken checks tk against prev, a copy of the previous take's state.
func checkTaken(t *testing.T, seed uint64, prev *ClusterState, tk Taken) {
	t.Helper()
	if !tk.Modified {
		if err := sameState(tk.State, prev); err != nil {
			t.Fatalf("seed %d: not modified, but %v", seed, err)
		}
		return
	}
	names := map[ServiceName]bool{}
	for _, st := range []*ClusterState{prev, tk.State} {
		for n := range st.Services {
			names[n] = true
		}
		for n := range st.Slices {
			names[n] = true
		}
	}
	for n := range names {
		same := prev.Services[n] == tk.State.Services[n] && maps.Equal(prev.Slices[n], tk.State.Slices[n])
		if !same && !tk.Changed[n] {
			t.Fatalf("seed %d: %s differs from the previous take, not named changed", seed, n)
		}
	}
	for n := range tk.Changed {
		_, had := prev.Services[n]
		_, has := tk.Prior.Services[n]
		if had != has || prev.Services[n] != tk.Prior.Services[n] || !maps.Equal(prev.Slices[n], tk.Prior.Slices[n]) {
			t.Fatalf("seed %d: Prior does not hold what the previous take had of %s", seed, n)
		}
	}
	if fmt.Sprint(tk.Prior.Node) != fmt.Sprint(prev.Node) {
		t.Fatalf("seed %d: Prior's Node %v, want %v", seed, tk.Prior.Node, prev.Node)
	}
}

// TestTrackerStateIsNotUpdatedInPlace checks that a snapshot from State stays as
// it was when a released taken state is updated in place.
func TestTrackerStateIsNotUpdatedInPlace(t *testing.T) {
	tr := NewTracker("node-a")
	mustNil(t, tr.UpdateService(named("web")))
	tk := tr.TakeState()
	snap := tr.State()
	tr.Release(tk.State)
	mustNil(t, tr.UpdateService(named("db")))
	again := tr.TakeState()
	if again.State != tk.State {
		t.Fatalf("a released state was copied, not updated in place")
	}
	if got := serviceNames(snap); len(got) != 1 || got[0] != "default/web" {
		t.Errorf("State's snapshot changed to %v", got)
	}
	if got := serviceNames(again.State); len(got) != 2 {
		t.Errorf("taken state %v, want web and db", got)
	}
}
