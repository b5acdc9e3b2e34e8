package syncer

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/internal/testenv"
	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestKernelIncrementalSyncs drives the incremental path into a real kernel, in a
// network namespace of its own: every step — including ones that need new shared
// chains and maps (an endpoint count not yet in use) — must apply incrementally,
// and the kernel's table must then hold what a fresh build holds.
func TestKernelIncrementalSyncs(t *testing.T) {
	_, nft := kernelNFT(t, "syncer")
	ctx := context.Background()
	st := cluster(30)
	s := New(nft)
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
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
		if fmt.Sprint(sorted(want)) != fmt.Sprint(sorted(named(got))) {
			t.Errorf("kernel %ss = %v; want %v", kind, sorted(named(got)), sorted(want))
		}
	}
	for _, c := range []struct{ kind, name string }{
		{"set", ruleset.ClassSet(ruleset.ChainServiceIPs, "goto dnat-1")},
		{"set", ruleset.SetClusterIPs},
		{"map", ruleset.MapBackends + "0"},
		{"map", ruleset.MapBackends + "8"},
	} {
		want, _ := f.ListElements(ctx, c.kind, c.name)
		got, err := nft.ListElements(ctx, c.kind, c.name)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) != len(got) || len(want) == 0 {
			t.Errorf("kernel %s %s has %d elements; want %d (and some)", c.kind, c.name, len(got), len(want))
		}
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// TestKernelFullSync loads full syncs through nft alone into a kernel table in a
// network namespace of its own: into an empty table, then over the table it made,
// after the kernel recorded a client in a session-affinity set. Every set and map
// listed back holds what the ruleset holds — keys, values and comments — and the
// affinity record survives the second full sync.
func TestKernelFullSync(t *testing.T) {
	_, nft := kernelNFT(t, "full", knftables.NoObjectCommentEmulation)
	ctx := context.Background()
	rs := ruleset.Build(cluster(60), testConfig, knftables.IPv4Family)
	s := New(nft)
	if res, err := s.Sync(ctx, rs); err != nil || !res.Full {
		t.Fatalf("first sync: %+v, %v; want a full sync", res, err)
	}
	checkKernelTable(t, nft, rs, nil)

	aff := dynamicSets(rs)
	if len(aff) == 0 {
		t.Fatal("the ruleset has no session-affinity set")
	}
	record := &knftables.Element{Set: aff[0], Key: sampleKey(t, rs.Sets[aff[0]].Type)}
	tx := nft.NewTransaction()
	tx.Add(record)
	if err := nft.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	s.RequestFullSync()
	if res, err := s.Sync(ctx, rs); err != nil || !res.Full {
		t.Fatalf("second sync: %+v, %v; want a full sync", res, err)
	}
	checkKernelTable(t, nft, rs, map[string][]string{aff[0]: {ruleset.ElementKey(record)}})
}

// checkKernelTable checks that the kernel's table has the chains, sets and maps of
// rs, and that every set and map holds the elements of rs, plus the keys of extra.
func checkKernelTable(t *testing.T, nft knftables.Interface, rs *ruleset.Ruleset, extra map[string][]string) {
	t.Helper()
	checkKernelNames(t, nft, map[string][]string{
		"chain": ruleset.SortedKeys(rs.Chains),
		"set":   ruleset.SortedKeys(rs.Sets),
		"map":   ruleset.SortedKeys(rs.Maps),
	})
	checkKernelElements(t, nft, rs, extra)
}

// checkKernelNames checks the names of the kernel table's chains, sets and maps.
func checkKernelNames(t *testing.T, nft knftables.Interface, names map[string][]string) {
	t.Helper()
	ctx := context.Background()
	for kind, want := range names {
		want = sorted(want)
		got, err := nft.List(ctx, kind)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, sorted(named(got))); diff != "" {
			t.Errorf("kernel %ss (-want +got):\n%s", kind, diff)
		}
	}
}

// checkKernelElements checks that every set and map of rs holds the elements of
// rs, plus the keys of extra, in the kernel's table.
func checkKernelElements(t *testing.T, nft knftables.Interface, rs *ruleset.Ruleset, extra map[string][]string) {
	t.Helper()
	ctx := context.Background()
	render := func(e *knftables.Element) string {
		s := strings.Join(e.Key, " . ")
		if e.Comment != nil {
			s += fmt.Sprintf(" comment %q", *e.Comment)
		}
		if len(e.Value) > 0 {
			s += " : " + strings.Join(e.Value, " . ")
		}
		return s
	}
	check := func(kind, name string) {
		var want []string
		for e := range rs.KnftElements(name) {
			want = append(want, render(e))
		}
		want = append(want, extra[name]...)
		es, err := nft.ListElements(ctx, kind, name)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range es {
			got = append(got, render(e))
		}
		if diff := cmp.Diff(sorted(want), sorted(got)); diff != "" {
			t.Errorf("kernel %s %s (-want +got):\n%s", kind, name, diff)
		}
	}
	for _, name := range ruleset.SortedKeys(rs.Sets) {
		check("set", name)
	}
	for _, name := range ruleset.SortedKeys(rs.Maps) {
		check("map", name)
	}
}

// BenchmarkKernelFullSync times a full sync of a large ruleset into an empty table of
// a real kernel (in a network namespace of its own), through nft alone and with the
// elements over netlink, with nft's malloc tunables (TuneNFT) off and on. The
// cluster size is $NFTPROXY_BENCH_SERVICES (default 50000):
//
//	go test ./proxier/syncer -run '^$' -bench KernelFullSync -benchtime 3x
func BenchmarkKernelFullSync(b *testing.B) {
	n := 50000
	if v := os.Getenv("NFTPROXY_BENCH_SERVICES"); v != "" {
		if _, err := fmt.Sscan(v, &n); err != nil {
			b.Fatalf("NFTPROXY_BENCH_SERVICES=%q: %v", v, err)
		}
	}
	ns, nft := kernelNFT(b, "bench")
	ctx := context.Background()
	rs := ruleset.Build(cluster(n), testConfig, knftables.IPv4Family)
	elements := 0
	for _, es := range rs.Elements {
		elements += len(es)
	}
	for _, netlink := range []bool{false, true} {
		for _, tuned := range []bool{false, true} {
			b.Run(fmt.Sprintf("netlink=%v/tunables=%v", netlink, tuned), func(b *testing.B) {
				if tuned {
					b.Setenv("GLIBC_TUNABLES", NFTTunables)
				} else {
					b.Setenv("GLIBC_TUNABLES", "")
				}
				for range b.N {
					b.StopTimer()
					tx := nft.NewTransaction()
					tx.Add(&knftables.Table{})
					tx.Delete(&knftables.Table{})
					if err := nft.Run(ctx, tx); err != nil {
						b.Fatal(err)
					}
					var opts []Option
					if netlink {
						opts = append(opts, WithNetlink(KernelNetlink(ns.Do)))
					}
					s := New(nft, opts...)
					b.StartTimer()
					if _, err := s.Sync(ctx, rs); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(elements), "elements")
			})
		}
	}
}

// kernelNFT returns a knftables.Interface on testConfig's table (IPv4) in a new
// network namespace named after name, which tb's cleanup removes. It skips tb unless
// it runs as root with nft installed.
func kernelNFT(tb testing.TB, name string, opts ...knftables.Option) (*lab.NS, knftables.Interface) {
	tb.Helper()
	testenv.RequireRoot(tb, "nft")
	ns, err := lab.NewNS(fmt.Sprintf("%s%s-%d", lab.NamePrefix, name, os.Getpid()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ns.Close() })
	// As the proxier does (proxier.DefaultNewNFT), list over netlink.
	nft, err := lab.NFT(ns, knftables.IPv4Family, testConfig.Table, append(opts, knftables.UseNetlink)...)
	if err != nil {
		tb.Fatal(err)
	}
	return ns, nft
}
