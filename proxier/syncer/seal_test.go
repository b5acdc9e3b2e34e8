package syncer

import (
	"context"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestSealTakesOverAnEqualRuleset checks the proxier's first sync: after a sync
// of a from-scratch Build and Seal, the Builder's ruleset of the same state is
// taken over without a write, and a ruleset that differs in one element, or in
// its rules, is written by a full sync.
func TestSealTakesOverAnEqualRuleset(t *testing.T) {
	ctx := context.Background()
	st := cluster(60)
	for _, tc := range []struct {
		name   string
		change func(*state.ClusterState)
		// write is true when the taken-over ruleset differs from the sealed one.
		write bool
	}{
		{"same state", func(*state.ClusterState) {}, false},
		{"one endpoint more, a count in use", func(st *state.ClusterState) {
			setEndpoints(st, state.ServiceName{Namespace: "ns", Name: "svc-3"}, 3, 2)
		}, true},
		{"a new endpoint count, new chains", func(st *state.ClusterState) {
			setEndpoints(st, state.ServiceName{Namespace: "ns", Name: "svc-3"}, 3, 31)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
			s := New(fake)
			if _, err := s.Sync(ctx, ruleset.Build(st, testConfig, knftables.IPv4Family)); err != nil {
				t.Fatal(err)
			}
			s.Seal()
			if s.Applied() != nil {
				t.Fatal("a sealed Syncer still holds the ruleset it applied")
			}
			st2 := clone(st)
			tc.change(st2)
			rs, _ := changeset.NewBuilder(testConfig, knftables.IPv4Family).Update(st2, nil)
			res, err := s.Sync(ctx, rs)
			if err != nil {
				t.Fatal(err)
			}
			if wrote := res.Operations > 0; wrote != tc.write || res.Full != tc.write {
				t.Errorf("take-over: %+v; want a full sync writing it: %v", res, tc.write)
			}
			if s.Applied() != rs {
				t.Error("the Builder's ruleset is not the applied one")
			}
			if got, want := canonical(fake.Dump()), fresh(t, rs); got != want {
				t.Errorf("table after the take-over differs from the ruleset:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
