package syncer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestKernelGenerationsVerifyTheResync follows the nf_tables generation of a
// namespace with the Syncers of its two tables (ip and ip6): a due full sync
// writes only what changed while no other writer committed, and rewrites the
// table after another writer's transaction (on any table), after a failed sync,
// and once RewriteEvery has passed.
func TestKernelGenerationsVerifyTheResync(t *testing.T) {
	ctx := context.Background()
	gens := NewGenerations()
	now := time.Now()
	gens.now = func() time.Time { return now }
	ns, nft4, s4 := netlinkSyncer(t, "gen", knftables.IPv4Family, WithGenerations(gens))
	nft6, err := lab.NFT(ns, knftables.IPv6Family, testConfig.Table, knftables.UseNetlink)
	if err != nil {
		t.Fatal(err)
	}
	s6 := New(nft6, WithNetlink(KernelNetlink(ns.Do)), WithGenerations(gens))
	st := cluster(30)
	b4 := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	b6 := changeset.NewBuilder(testConfig, knftables.IPv6Family)
	families := []struct {
		s *Syncer
		b *changeset.Builder
	}{{s4, b4}, {s6, b6}}
	changed := map[state.ServiceName]bool{}
	// sync syncs both tables as the proxier does, after RequestFullSync when full
	// is set, and returns the ip table's Result.
	sync := func(step string, full bool) Result {
		t.Helper()
		var res4 Result
		for i, f := range families {
			if full {
				f.s.RequestFullSync()
			}
			rs, d := f.b.Update(st, changed)
			res, err := f.s.Apply(ctx, rs, d)
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			if i == 0 {
				res4 = res
			}
		}
		clear(changed)
		return res4
	}
	if res := sync("first sync", false); !res.Full || res.Verified {
		t.Fatalf("first sync: %+v; want a full one", res)
	}
	if res := sync("resync", true); res.Full || !res.Verified || res.Operations != 0 {
		t.Fatalf("resync of an untouched namespace: %+v; want it verified, writing nothing", res)
	}
	// A change and a resync at once: the change alone is written.
	name := state.ServiceName{Namespace: "ns", Name: "svc-3"}
	st = clone(st)
	setEndpoints(st, name, 3, 2)
	changed[name] = true
	if res := sync("resync with a change", true); res.Full || !res.Verified || res.Operations == 0 || res.Operations > 20 {
		t.Fatalf("resync with one change: %+v; want it verified, writing the change", res)
	}
	checkKernelTable(t, nft4, s4.Applied(), nil)

	// Another writer: a table of its own, then an element in ours.
	for _, w := range []struct{ what, nft string }{
		{"another table", "add table ip other\n"},
		{"our table", fmt.Sprintf("add element ip %s %s { 10.9.9.9 }\n", testConfig.Table, ruleset.SetClusterIPs)},
	} {
		if err := ns.NFTApply(ctx, w.nft); err != nil {
			t.Fatal(err)
		}
		if res := sync("resync after a write to "+w.what, true); !res.Full || res.Verified {
			t.Fatalf("resync after another writer's transaction on %s: %+v; want a full rewrite", w.what, res)
		}
		checkKernelTable(t, nft4, s4.Applied(), nil)
		if res := sync("the resync after", true); res.Full || !res.Verified {
			t.Fatalf("the resync after the rewrite: %+v; want it verified", res)
		}
	}
	// An incremental sync that is not due to be full stays as it was; another
	// writer's transaction before it, which it does not read the generation for,
	// still makes the next resync a rewrite.
	if err := ns.NFTApply(ctx, "add table ip other2\n"); err != nil {
		t.Fatal(err)
	}
	st = clone(st)
	setEndpoints(st, name, 3, 4)
	changed[name] = true
	if res := sync("incremental", false); res.Full || res.Verified {
		t.Fatalf("incremental sync: %+v; want neither full nor verified", res)
	}
	if res := sync("resync after a write before an incremental sync", true); !res.Full || res.Verified {
		t.Fatalf("resync after another writer's transaction before an incremental sync: %+v; want a full rewrite", res)
	}
	// RewriteEvery.
	now = now.Add(RewriteEvery + time.Minute)
	if res := sync("resync an hour later", true); !res.Full || res.Verified {
		t.Fatalf("resync after RewriteEvery: %+v; want a full rewrite", res)
	}
	if res := sync("the resync after", true); res.Full || !res.Verified {
		t.Fatalf("the resync after: %+v; want it verified", res)
	}
	// A failed sync: the table of ours is deleted under the Syncer, whose next
	// incremental sync fails; the full sync after rewrites it.
	if err := ns.NFTApply(ctx, fmt.Sprintf("delete table ip %s\n", testConfig.Table)); err != nil {
		t.Fatal(err)
	}
	st = clone(st)
	setEndpoints(st, name, 4, 4) // other addresses, the same count: elements only
	changed[name] = true
	rs, d := b4.Update(st, changed)
	// Its netlink batch fails first, which drops the transport the generation is
	// read through.
	if res, err := s4.Apply(ctx, rs, d); err == nil || res.Fallback == nil {
		t.Fatalf("incremental sync into a deleted table: %+v, %v; want the batch and nft to fail", res, err)
	}
	if res, err := s4.Apply(ctx, rs, changeset.NewDelta()); err != nil || !res.Full {
		t.Fatalf("the sync after a failure: %+v, %v; want a full rewrite", res, err)
	}
	checkKernelTable(t, nft4, rs, nil)
}

// TestGenerationsNeedTheKernel gives a Syncer writing a Fake Generations: without
// a generation to read, every due full sync rewrites the table.
func TestGenerationsNeedTheKernel(t *testing.T) {
	ctx := context.Background()
	fake := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	s := New(fake, WithNetlink(DecodedNetlink(fake)), WithGenerations(NewGenerations()))
	rs := ruleset.Build(cluster(10), testConfig, knftables.IPv4Family)
	for i := range 3 {
		s.RequestFullSync()
		if res, err := s.Sync(ctx, rs); err != nil || !res.Full || res.Verified {
			t.Fatalf("sync %d: %+v, %v; want a full rewrite", i, res, err)
		}
	}
}
