package syncer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestKernelIncrementalSyncs drives the incremental path into a real kernel, in a
// network namespace of its own: every step — including ones that need new shared
// chains and maps (an endpoint count not yet in use) — must apply incrementally,
// and the kernel's table must then hold what a fresh build holds.
func TestKernelIncrementalSyncs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: syncs into a new network namespace")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft")
	}
	ns, err := lab.NewNS(fmt.Sprintf("%ssyncer-%d", lab.NamePrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	nft, err := lab.NFT(ns, knftables.IPv4Family, testConfig.Table)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st := cluster(30)
	s := New(nft)
	b := ruleset.NewBuilder(testConfig, knftables.IPv4Family)
	rs, d := b.Update(st, nil)
	if _, err := s.Apply(ctx, rs, d); err != nil {
		t.Fatalf("full sync: %v", err)
	}
	for step, n := range []int{7, 0, 2, 9, 1, 3} {
		st = clone(st)
		name := state.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", step)}
		setEndpoints(st, name, step, n)
		rs, d := b.Update(st, map[state.ServiceName]bool{name: true})
		res, err := s.Apply(ctx, rs, d)
		if err != nil {
			t.Fatalf("step %d (%s to %d endpoints): %v", step, name, n, err)
		}
		if res.Full {
			t.Errorf("step %d: a full sync; want incremental", step)
		}
	}
	// The kernel's table, listed back, equals a fresh build of the final state.
	f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	tx := f.NewTransaction()
	ruleset.Build(st, testConfig, knftables.IPv4Family).AddTo(tx)
	if err := f.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"chain", "set", "map"} {
		want, _ := f.List(ctx, kind)
		got, err := nft.List(ctx, kind)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(sorted(want)) != fmt.Sprint(sorted(got)) {
			t.Errorf("kernel %ss = %v; want %v", kind, sorted(got), sorted(want))
		}
	}
	for _, m := range []string{ruleset.MapServiceIPs, ruleset.MapBackends + "0", ruleset.MapBackends + "8"} {
		want, _ := f.ListElements(ctx, "map", m)
		got, err := nft.ListElements(ctx, "map", m)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) != len(got) {
			t.Errorf("kernel map %s has %d elements; want %d", m, len(got), len(want))
		}
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }
