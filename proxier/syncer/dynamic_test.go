package syncer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// dynamicRuleset is baseRuleset with a dynamic set "aff" (timeout to), filled at run
// time by a rule, and a static set "static" with one element.
func dynamicRuleset(to time.Duration) *ruleset.Ruleset {
	rs := baseRuleset()
	rs.AddSet(&knftables.Set{Name: "aff", Type: "ipv4_addr",
		Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: &to})
	rs.AddSet(&knftables.Set{Name: "static", Type: "ipv4_addr"})
	rs.AddKnftElement(&knftables.Element{Set: "static", Key: []string{"10.9.9.9"}})
	rs.AddChain(knftables.Chain{Name: "svc"})
	rs.AddRule("svc", "update @aff { ip saddr }")
	return rs
}

// addOutside adds elements to sets behind the Syncer's back, as the kernel's
// "update @set" rules and outsiders do.
func addOutside(t *testing.T, f *knftables.Fake, set string, keys ...string) {
	t.Helper()
	tx := f.NewTransaction()
	for _, k := range keys {
		tx.Add(&knftables.Element{Set: set, Key: []string{k}})
	}
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
}

func elementKeys(t *testing.T, f *knftables.Fake, set string) []string {
	t.Helper()
	es, err := f.ListElements(context.Background(), "set", set)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range es {
		keys = append(keys, ruleset.ElementKey(e))
	}
	return sorted(keys)
}

// TestFullSyncKeepsTheElementsOfDynamicSets runs a full sync over a table whose
// dynamic and static sets got elements behind the Syncer's back, through Sync and
// through Apply (whose applied ruleset is live, so that the Syncer must remember
// set definitions itself).
func TestFullSyncKeepsTheElementsOfDynamicSets(t *testing.T) {
	for _, mode := range []string{"Sync", "Apply"} {
		t.Run(mode, func(t *testing.T) {
			f := knftables.NewFake(fam, table)
			var prev *ruleset.Ruleset
			sync := func(s *Syncer, rs *ruleset.Ruleset) Result {
				t.Helper()
				if mode == "Sync" {
					return mustSync(t, s, rs)
				}
				var d *changeset.Delta
				if prev != nil {
					d = changeset.Diff(prev, rs)
				}
				prev = rs
				return mustApply(t, s, rs, d)
			}
			s := New(f)
			sync(s, dynamicRuleset(time.Hour))
			addOutside(t, f, "aff", "10.0.0.1", "10.0.0.2")
			addOutside(t, f, "static", "10.6.6.6")

			s.RequestFullSync()
			if res := sync(s, dynamicRuleset(time.Hour)); !res.Full {
				t.Fatalf("requested full sync was not full")
			}
			if got, want := elementKeys(t, f, "aff"), []string{"10.0.0.1", "10.0.0.2"}; !cmp.Equal(got, want) {
				t.Errorf("dynamic set after a full sync: %v; want its run-time elements %v", got, want)
			}
			if got, want := elementKeys(t, f, "static"), []string{"10.9.9.9"}; !cmp.Equal(got, want) {
				t.Errorf("static set after a full sync: %v; want %v", got, want)
			}
			if tx := f.LastTransaction.String(); strings.Contains(tx, "flush set ip synctest aff") || !strings.Contains(tx, "flush set ip synctest static") {
				t.Errorf("full sync should flush the static set and not the dynamic one:\n%s", tx)
			}

			// A restarted proxier, which knows nothing of the table, keeps them too.
			s, prev = New(f), nil
			sync(s, dynamicRuleset(time.Hour))
			if got, want := elementKeys(t, f, "aff"), []string{"10.0.0.1", "10.0.0.2"}; !cmp.Equal(got, want) {
				t.Errorf("dynamic set after adoption by a new Syncer: %v; want %v", got, want)
			}

			// A changed definition recreates the set, and its elements go.
			res := sync(s, dynamicRuleset(2*time.Hour))
			if !res.Full {
				t.Errorf("changing the dynamic set's timeout: not a full sync")
			}
			if got := elementKeys(t, f, "aff"); len(got) != 0 {
				t.Errorf("dynamic set recreated with a new timeout still has elements %v", got)
			}
			if !strings.Contains(f.Dump(), "timeout 7200s") {
				t.Errorf("dynamic set not recreated with its new timeout:\n%s", f.Dump())
			}
			if diff := cmp.Diff(fresh(t, dynamicRuleset(2*time.Hour)), canonical(f.Dump())); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
		})
	}
}

// sampleKey returns the key of an element of a set of type typ ("ipv4_addr .
// inet_service", ...), with made-up values.
func sampleKey(t *testing.T, typ string) []string {
	t.Helper()
	var key []string
	for i, part := range strings.Split(typ, " . ") {
		switch part {
		case "ipv4_addr":
			key = append(key, fmt.Sprintf("10.200.0.%d", i+1))
		case "ipv6_addr":
			key = append(key, fmt.Sprintf("fd00:200::%d", i+1))
		case "inet_proto":
			key = append(key, "tcp")
		case "inet_service":
			key = append(key, "80")
		default:
			t.Fatalf("sampleKey: no sample value for %q", part)
		}
	}
	return key
}

// dynamicSets returns the names of the sets of rs with the dynamic flag.
func dynamicSets(rs *ruleset.Ruleset) []string {
	var names []string
	for _, name := range ruleset.SortedKeys(rs.Sets) {
		if slices.Contains(rs.Sets[name].Flags, knftables.DynamicFlag) {
			names = append(names, name)
		}
	}
	return names
}

// TestApplyFullSyncKeepsAffinityRecords drives the production path — Builder.Update
// feeding Syncer.Apply — with the builder's session-affinity sets.
func TestApplyFullSyncKeepsAffinityRecords(t *testing.T) {
	st := cluster(20) // svc-6 and svc-16 have ClientIP affinity
	f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	s := New(f)
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	rs, d := b.Update(st, nil)
	mustApply(t, s, rs, d)
	aff := dynamicSets(rs)
	if len(aff) == 0 {
		t.Fatalf("the cluster has no session-affinity set")
	}
	records := map[string]*knftables.Element{}
	tx := f.NewTransaction()
	for _, name := range aff {
		records[name] = &knftables.Element{Set: name, Key: sampleKey(t, rs.Sets[name].Type)}
		tx.Add(records[name])
	}
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}

	s.RequestFullSync()
	rs, d = b.Update(st, map[state.ServiceName]bool{})
	if res := mustApply(t, s, rs, d); !res.Full {
		t.Fatalf("requested full sync was not full")
	}
	tx = f.NewTransaction()
	for _, name := range aff {
		want := []string{ruleset.ElementKey(records[name])}
		if got := elementKeys(t, f, name); !cmp.Equal(got, want) {
			t.Errorf("affinity set %s after a full sync: %v; want its record %v", name, got, want)
		}
		tx.Delete(records[name])
	}
	// Apart from the records, the table is a fresh build's.
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(fresh(t, ruleset.Build(st, testConfig, knftables.IPv4Family)), canonical(f.Dump())); diff != "" {
		t.Errorf("table differs from a fresh build (-want +got):\n%s", diff)
	}
}
