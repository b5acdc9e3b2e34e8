package syncer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

const (
	fam   = knftables.IPv4Family
	table = "synctest"
)

// canonical returns a dump with element lines sorted: element order inside a set is
// not meaningful, while chain and rule order is.
func canonical(dump string) string {
	var other, elems []string
	for _, l := range strings.Split(strings.TrimSpace(dump), "\n") {
		if strings.HasPrefix(l, "add element ") {
			elems = append(elems, l)
		} else {
			other = append(other, l)
		}
	}
	sort.Strings(elems)
	return strings.Join(append(other, elems...), "\n")
}

// fresh applies rs to an empty Fake in one transaction and returns the dump.
func fresh(t *testing.T, rs *ruleset.Ruleset) string {
	t.Helper()
	f := knftables.NewFake(rs.Family, rs.Table)
	tx := f.NewTransaction()
	rs.AddTo(tx)
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatalf("fresh apply: %v", err)
	}
	return canonical(f.Dump())
}

func baseRuleset() *ruleset.Ruleset {
	rs := ruleset.New(fam, table)
	rs.Comment = "test"
	rs.AddChain(knftables.Chain{Name: "pre", Type: knftables.PtrTo(knftables.NATType),
		Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.BaseChainPriority("-100"))})
	rs.AddChain(knftables.Chain{Name: "dispatch"})
	rs.AddChain(knftables.Chain{Name: "reject-chain"})
	rs.AddRule("pre", "jump dispatch")
	rs.AddRule("reject-chain", "reject")
	rs.AddMap(&knftables.Map{Name: "vips", Type: "ipv4_addr . inet_proto . inet_service : verdict"})
	rs.AddRule("dispatch", "ip daddr . meta l4proto . th dport vmap @vips")
	return rs
}

func addVIP(rs *ruleset.Ruleset, ip string, port int, verdict string) {
	rs.AddKnftElement(&knftables.Element{Map: "vips", Key: []string{ip, "tcp", fmt.Sprint(port)}, Value: []string{verdict}})
}

func mustSync(t *testing.T, s *Syncer, rs *ruleset.Ruleset) Result {
	t.Helper()
	res, err := s.Sync(context.Background(), rs)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return res
}

func TestFirstSyncIsFullAndMatchesFreshApply(t *testing.T) {
	f := knftables.NewFake(fam, table)
	s := New(f)
	rs := baseRuleset()
	addVIP(rs, "172.30.0.1", 80, "goto reject-chain")
	res := mustSync(t, s, rs)
	if !res.Full {
		t.Errorf("first sync: Full = false, want true")
	}
	if diff := cmp.Diff(fresh(t, rs), canonical(f.Dump())); diff != "" {
		t.Errorf("dump after first sync (-want +got):\n%s", diff)
	}
}

func TestIncrementalSyncSendsOnlyTheChange(t *testing.T) {
	f := knftables.NewFake(fam, table)
	s := New(f)
	build := func(n int, changed string) *ruleset.Ruleset {
		rs := baseRuleset()
		for i := range n {
			v := "goto reject-chain"
			if fmt.Sprint(i) == changed {
				v = "drop"
			}
			addVIP(rs, fmt.Sprintf("172.30.%d.%d", i/250, i%250+1), 80, v)
		}
		return rs
	}
	mustSync(t, s, build(1000, ""))

	res := mustSync(t, s, build(1000, "17"))
	if res.Full {
		t.Fatalf("second sync was full")
	}
	if res.Operations != 2 {
		t.Errorf("changing one element value: %d operations, want 2 (delete + add)\n%s", res.Operations, f.LastTransaction)
	}
	res = mustSync(t, s, build(1001, "17"))
	if res.Operations != 1 {
		t.Errorf("adding one element: %d operations, want 1\n%s", res.Operations, f.LastTransaction)
	}
	res = mustSync(t, s, build(1001, "17"))
	if res.Operations != 0 {
		t.Errorf("no change: %d operations, want 0", res.Operations)
	}
	if diff := cmp.Diff(fresh(t, build(1001, "17")), canonical(f.Dump())); diff != "" {
		t.Errorf("dump (-want +got):\n%s", diff)
	}
}

func TestRemovingAChainReferencedByElementsAndRules(t *testing.T) {
	f := knftables.NewFake(fam, table)
	s := New(f, WithKeepLimit(0))
	rs := baseRuleset()
	rs.AddChain(knftables.Chain{Name: "svc-a"})
	rs.AddRule("svc-a", "ip saddr @aff-a accept")
	rs.AddSet(&knftables.Set{Name: "aff-a", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: knftables.PtrTo(3 * time.Hour)})
	addVIP(rs, "172.30.0.1", 80, "goto svc-a")
	mustSync(t, s, rs)

	rs2 := baseRuleset()
	res := mustSync(t, s, rs2)
	// delete element, flush chain, delete chain, delete set
	if res.Operations != 4 {
		t.Errorf("removing a service chain: %d operations, want 4\n%s", res.Operations, f.LastTransaction)
	}
	got := f.Dump()
	for _, name := range []string{"svc-a", "aff-a", "172.30.0.1"} {
		if strings.Contains(got, name) {
			t.Errorf("dump still mentions %q after removal:\n%s", name, got)
		}
	}
}

func TestChangedRulesFlushAndRewriteOnlyThatChain(t *testing.T) {
	f := knftables.NewFake(fam, table)
	s := New(f)
	mustSync(t, s, baseRuleset())
	rs := baseRuleset()
	rs.Chains["reject-chain"].Rules = nil
	rs.AddRule("reject-chain", "reject with icmp type host-prohibited")
	res := mustSync(t, s, rs)
	if res.Operations != 2 {
		t.Errorf("rewriting one rule: %d operations, want 2 (flush + add)\n%s", res.Operations, f.LastTransaction)
	}
	if !strings.Contains(f.Dump(), "host-prohibited") {
		t.Errorf("new rule missing from dump")
	}
}

func TestSetDefinitionChangeTakesAFullSync(t *testing.T) {
	f := knftables.NewFake(fam, table)
	s := New(f)
	rs := baseRuleset()
	rs.AddSet(&knftables.Set{Name: "aff", Type: "ipv4_addr", Timeout: knftables.PtrTo(10 * time.Second)})
	mustSync(t, s, rs)
	rs2 := baseRuleset()
	rs2.AddSet(&knftables.Set{Name: "aff", Type: "ipv4_addr", Timeout: knftables.PtrTo(20 * time.Second)})
	res := mustSync(t, s, rs2)
	if !res.Full {
		t.Errorf("changing a set's timeout: Full = false, want a full sync")
	}
	if !strings.Contains(f.Dump(), "timeout 20s") {
		t.Errorf("set not recreated with its new timeout:\n%s", f.Dump())
	}
}

func TestFullSyncAdoptsATableAndRemovesStaleObjects(t *testing.T) {
	f := knftables.NewFake(fam, table)
	stale := baseRuleset()
	stale.AddChain(knftables.Chain{Name: "old-chain"})
	stale.AddRule("old-chain", "drop")
	stale.AddSet(&knftables.Set{Name: "old-set", Type: "ipv4_addr"})
	stale.AddKnftElement(&knftables.Element{Set: "old-set", Key: []string{"10.0.0.1"}})
	addVIP(stale, "172.30.0.9", 9, "goto old-chain")
	tx := f.NewTransaction()
	stale.AddTo(tx)
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}

	want := baseRuleset()
	addVIP(want, "172.30.0.1", 80, "goto reject-chain")
	s := New(f) // a restarted proxier: knows nothing of what is in the table
	mustSync(t, s, want)
	if diff := cmp.Diff(fresh(t, want), canonical(f.Dump())); diff != "" {
		t.Errorf("adopted table (-want +got):\n%s", diff)
	}
}

func TestDriftIsRepairedByFullSyncAndAfterAFailure(t *testing.T) {
	ctx := context.Background()
	f := knftables.NewFake(fam, table)
	s := New(f)
	rs := baseRuleset()
	addVIP(rs, "172.30.0.1", 80, "goto reject-chain")
	mustSync(t, s, rs)

	// An outsider deletes our table.
	tx := f.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := f.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	rs2 := baseRuleset()
	addVIP(rs2, "172.30.0.1", 80, "goto reject-chain")
	addVIP(rs2, "172.30.0.2", 80, "goto reject-chain")
	if _, err := s.Sync(ctx, rs2); err == nil {
		t.Fatalf("incremental sync into a deleted table succeeded; want an error")
	}
	res := mustSync(t, s, rs2)
	if !res.Full {
		t.Errorf("sync after a failed one: Full = false, want true")
	}
	if diff := cmp.Diff(fresh(t, rs2), canonical(f.Dump())); diff != "" {
		t.Errorf("repaired table (-want +got):\n%s", diff)
	}

	// An outsider deletes an element; a requested full sync puts it back.
	tx = f.NewTransaction()
	tx.Delete(&knftables.Element{Map: "vips", Key: []string{"172.30.0.2", "tcp", "80"}})
	if err := f.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	s.RequestFullSync()
	if res := mustSync(t, s, rs2); !res.Full {
		t.Errorf("requested full sync was not full")
	}
	if diff := cmp.Diff(fresh(t, rs2), canonical(f.Dump())); diff != "" {
		t.Errorf("repaired element (-want +got):\n%s", diff)
	}
}

// randomRuleset draws a ruleset over a small universe of names so that successive
// draws share, change and drop objects. References always point at objects present.
func randomRuleset(r *rand.Rand) *ruleset.Ruleset {
	rs := baseRuleset()
	var chains []string
	for i := range 6 {
		if r.IntN(3) > 0 {
			name := fmt.Sprintf("c%d", i)
			chains = append(chains, name)
			rs.AddChain(knftables.Chain{Name: name})
		}
	}
	var sets []string
	for i := range 4 {
		if r.IntN(3) > 0 {
			name := fmt.Sprintf("s%d", i)
			sets = append(sets, name)
			rs.AddSet(&knftables.Set{Name: name, Type: "ipv4_addr"})
			for j := range r.IntN(5) {
				rs.AddKnftElement(&knftables.Element{Set: name, Key: []string{fmt.Sprintf("10.0.%d.%d", i, j+r.IntN(3))}})
			}
		}
	}
	for ci, c := range chains {
		for range r.IntN(4) {
			switch {
			case len(sets) > 0 && r.IntN(2) == 0:
				rs.AddRule(c, fmt.Sprintf("ip saddr @%s accept", sets[r.IntN(len(sets))]))
			case ci+1 < len(chains):
				rs.AddRule(c, "jump "+chains[ci+1+r.IntN(len(chains)-ci-1)])
			default:
				rs.AddRule(c, fmt.Sprintf("tcp dport %d drop", r.IntN(4)))
			}
		}
	}
	targets := append([]string{"reject-chain"}, chains...)
	for i := range r.IntN(12) {
		verdict := "goto " + targets[r.IntN(len(targets))]
		if r.IntN(4) == 0 {
			verdict = "drop"
		}
		addVIP(rs, fmt.Sprintf("172.30.0.%d", i+1), 80+r.IntN(2), verdict)
	}
	return rs
}

func TestPropertyIncrementalEqualsFullSync(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		f := knftables.NewFake(fam, table)
		s := New(f, WithKeepLimit(0))
		for step := range 30 {
			rs := randomRuleset(r)
			if _, err := s.Sync(context.Background(), rs); err != nil {
				t.Fatalf("seed %d step %d: %v\ntransaction:\n%s", seed, step, err, f.LastTransaction)
			}
			if diff := cmp.Diff(fresh(t, rs), canonical(f.Dump())); diff != "" {
				t.Fatalf("seed %d step %d: incremental dump differs from a full sync (-want +got):\n%s", seed, step, diff)
			}
		}
	}
}
