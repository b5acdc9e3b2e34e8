package syncer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// keepScenario scales one Service of a 20-Service cluster (endpoint counts 1 to 5)
// to 9 endpoints, back to 1, to 9 again and back to 1, through a Syncer that keeps
// emptied objects, and checks what stays in the table and what each sync costs.
// It returns the Syncer and the final state's ruleset; after, if not nil, is called
// after each step.
func keepScenario(t *testing.T, nft knftables.Interface, limit int, after func(step int)) (*Syncer, *ruleset.Ruleset, []Result) {
	t.Helper()
	ctx := context.Background()
	st := cluster(20)
	name := state.ServiceName{Namespace: "ns", Name: "svc-3"}
	s := New(nft, WithKeepLimit(limit))
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	rs, d := b.Update(st, nil)
	if _, err := s.Apply(ctx, rs, d); err != nil {
		t.Fatalf("full sync: %v", err)
	}
	var results []Result
	for step, n := range []int{9, 1, 9, 1} {
		st = clone(st)
		setEndpoints(st, name, 3, n)
		rs, d = b.Update(st, map[state.ServiceName]bool{name: true})
		res, err := s.Apply(ctx, rs, d)
		if err != nil {
			t.Fatalf("step %d (%d endpoints): %v", step, n, err)
		}
		if res.Full {
			t.Fatalf("step %d: a full sync; want incremental", step)
		}
		results = append(results, res)
		if after != nil {
			after(step)
		}
	}
	return s, rs, results
}

func chainNames(t *testing.T, nft knftables.Interface) []string {
	t.Helper()
	names, err := nft.List(context.Background(), "chain")
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestKeptObjectsMakeTheNextScaleUpCheap(t *testing.T) {
	f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	s, rs, res := keepScenario(t, f, 64, nil)
	// The first scale-up creates dnat-9, its backends maps and chains, the class set
	// and its rule; the second finds them all in place.
	if res[2].Operations >= res[0].Operations {
		t.Errorf("second scale-up: %d operations; want fewer than the first's %d", res[2].Operations, res[0].Operations)
	}
	if _, ok := rs.Chains["dnat-9"]; ok {
		t.Fatal("test is broken: the final ruleset has dnat-9")
	}
	if !slices.Contains(chainNames(t, f), "dnat-9") {
		t.Errorf("dnat-9 was not kept after the scale-down")
	}
	set := ruleset.ClassSet(ruleset.ChainServiceIPs, "goto dnat-9")
	if els, err := f.ListElements(context.Background(), "set", set); err != nil || len(els) != 0 {
		t.Errorf("kept class set %s: elements %v, err %v; want an empty set", set, els, err)
	}
	// Tidy removes what was kept: the table is then the ruleset exactly.
	tres, err := s.Tidy(context.Background())
	if err != nil || tres.Operations == 0 {
		t.Fatalf("Tidy: %+v, %v; want a transaction", tres, err)
	}
	if diff := cmp.Diff(fresh(t, rs), canonical(f.Dump())); diff != "" {
		t.Errorf("table after Tidy differs from a fresh build (-want +got):\n%s", diff)
	}
	if tres, err := s.Tidy(context.Background()); err != nil || tres.Operations != 0 {
		t.Errorf("second Tidy: %+v, %v; want nothing to do", tres, err)
	}
}

func TestSecondScaleUpAddsNoObject(t *testing.T) {
	f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	keepScenario(t, f, 64, func(step int) {
		tx := f.LastTransaction.String()
		if step == 2 {
			for _, unwanted := range []string{"add chain", "add set", "add map", "flush chain", "add rule", "delete"} {
				if strings.Contains(tx, unwanted+" ") && !(unwanted == "delete" && strings.Contains(tx, "delete element")) {
					t.Errorf("second scale-up has %q:\n%s", unwanted, tx)
				}
			}
		}
		if step == 1 && (strings.Contains(tx, "delete chain") || strings.Contains(tx, "delete set") || strings.Contains(tx, "delete map")) {
			t.Errorf("scale-down deleted an object it should keep:\n%s", tx)
		}
	})
}

func TestKeepLimitTidiesInTheSameSync(t *testing.T) {
	f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	_, rs, _ := keepScenario(t, f, 1, nil)
	// Each scale-down empties more than one object: the sync removes them at once.
	if diff := cmp.Diff(fresh(t, rs), canonical(f.Dump())); diff != "" {
		t.Errorf("table differs from a fresh build although the keep limit was exceeded (-want +got):\n%s", diff)
	}
}

// TestKernelKeptObjects runs the scenario against a real kernel: nft must take the
// appended dispatch rules, the emptied objects and Tidy's removal of them.
func TestKernelKeptObjects(t *testing.T) {
	_, nft := kernelNFT(t, "keep")
	s, rs, res := keepScenario(t, nft, 64, nil)
	if res[2].Operations >= res[0].Operations {
		t.Errorf("second scale-up: %d operations; want fewer than the first's %d", res[2].Operations, res[0].Operations)
	}
	if !slices.Contains(chainNames(t, nft), "dnat-9") {
		t.Errorf("dnat-9 was not kept after the scale-down")
	}
	if _, err := s.Tidy(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkKernelTable(t, nft, rs, nil)
}

func TestNotFoundKnowsTheNetlinkListing(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("receiveAckAware: netlink receive: no such file or directory"), true},
		{fmt.Errorf("list: %w", syscall.ENOENT), true},
		{errors.New("receiveAckAware: netlink receive: operation not permitted"), false},
		{errors.New("no such file or directory in the middle: of something"), false},
	} {
		if got := notFound(c.err); got != c.want {
			t.Errorf("notFound(%q) = %v, want %v", c.err, got, c.want)
		}
	}
}
