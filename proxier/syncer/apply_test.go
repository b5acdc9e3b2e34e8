package syncer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// The tests in this file drive the incremental path: changeset.Builder.Update feeding
// Syncer.Apply, as the daemon does.

func mustApply(t *testing.T, s *Syncer, rs *ruleset.Ruleset, d *changeset.Delta) Result {
	t.Helper()
	res, err := s.Apply(context.Background(), rs, d)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

func TestApplyOneServiceChangeAt1000Services(t *testing.T) {
	st := cluster(1000)
	f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	s := New(f)
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	rs, d := b.Update(st, nil)
	if res := mustApply(t, s, rs, d); !res.Full {
		t.Fatalf("first apply not full")
	}
	for _, tc := range []struct {
		svc   int
		delta int
	}{{10, +1}, {21, -1}, {17, +1}, {29, +1}, {49, -1}, {16, +1}, {15, +1}, {3, -1}} {
		st = clone(st)
		name := state.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", tc.svc)}
		setEndpoints(st, name, tc.svc, 1+(tc.svc/10)%5+tc.delta)
		rs, d := b.Update(st, map[state.ServiceName]bool{name: true})
		res := mustApply(t, s, rs, d)
		if res.Full || res.Operations == 0 || res.Operations > 20 {
			t.Errorf("svc-%d %+d endpoint: full=%v, %d operations; want an incremental transaction of 1..20:\n%s", tc.svc, tc.delta, res.Full, res.Operations, f.LastTransaction)
		}
	}
	if diff := cmp.Diff(fresh(t, ruleset.Build(st, testConfig, knftables.IPv4Family)), canonical(f.Dump())); diff != "" {
		t.Errorf("after incremental applies the table differs from a fresh build (-want +got):\n%s", diff)
	}
}

// TestPropertyBuilderChurnEqualsFreshBuild applies random churn (including Services
// that fight over the same ExternalIP and node port) through Builder.Update with
// only the changed Services named, and checks after each step that both the
// Builder's ruleset and the table equal a fresh Build.
func TestPropertyBuilderChurnEqualsFreshBuild(t *testing.T) {
	for seed := range uint64(15) {
		r := rand.New(rand.NewPCG(seed, 5))
		st := cluster(30)
		f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
		s := New(f, WithKeepLimit(0))
		b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
		rs, d := b.Update(st, nil)
		mustApply(t, s, rs, d)
		for step := range 40 {
			var name state.ServiceName
			st, name = churnStep(st, r, true)
			rs, d := b.Update(st, map[state.ServiceName]bool{name: true})
			want := ruleset.Build(st, testConfig, knftables.IPv4Family)
			if n := changeset.Diff(want, rs).Len(); n != 0 {
				t.Fatalf("seed %d step %d: builder ruleset differs from a fresh Build in %d objects", seed, step, n)
			}
			if _, err := s.Apply(context.Background(), rs, d); err != nil {
				t.Fatalf("seed %d step %d: %v\n%s", seed, step, err, f.LastTransaction)
			}
			if diff := cmp.Diff(fresh(t, want), canonical(f.Dump())); diff != "" {
				t.Fatalf("seed %d step %d: table differs from a fresh Build (-want +got):\n%s", seed, step, diff)
			}
		}
	}
}

func TestApplyAfterFailureIsFull(t *testing.T) {
	ctx := context.Background()
	st := cluster(20)
	f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	s := New(f)
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	rs, d := b.Update(st, nil)
	mustApply(t, s, rs, d)
	tx := f.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := f.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	st = clone(st)
	name := state.ServiceName{Namespace: "ns", Name: "svc-3"}
	setEndpoints(st, name, 3, 4)
	rs, d = b.Update(st, map[state.ServiceName]bool{name: true})
	if _, err := s.Apply(ctx, rs, d); err == nil {
		t.Fatalf("apply into a deleted table succeeded")
	}
	rs, d = b.Update(st, map[state.ServiceName]bool{})
	if res := mustApply(t, s, rs, d); !res.Full {
		t.Errorf("apply after a failure was not full")
	}
	if diff := cmp.Diff(fresh(t, ruleset.Build(st, testConfig, knftables.IPv4Family)), canonical(f.Dump())); diff != "" {
		t.Errorf("repaired table (-want +got):\n%s", diff)
	}
}
