package syncer

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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

// textNFT is a knftables.Interface that records the text of the transactions it is
// asked to run, as a real nft would read it, instead of running them. Its
// transactions come from a Fake, which writes them as knftables's real Interface
// does (the text of an operation depends only on the family and table), but it
// hides the Fake, so a Syncer groups elements for it. No nft is run.
type textNFT struct {
	knftables.Interface // a Fake, for NewTransaction
	existing            map[string][]string
	fail                int // Run fails this many times
	runs                []string
}

func newTextNFT(family knftables.Family, table string) *textNFT {
	return &textNFT{Interface: knftables.NewFake(family, table)}
}

// ListAll returns existing, or the Fake's "no such table" when existing is nil.
func (n *textNFT) ListAll(ctx context.Context) (map[string][]string, error) {
	if n.existing == nil {
		return n.Interface.ListAll(ctx)
	}
	return n.existing, nil
}

func (n *textNFT) Run(_ context.Context, tx *knftables.Transaction) error {
	n.runs = append(n.runs, tx.String())
	if n.fail > 0 {
		n.fail--
		return errors.New("injected failure")
	}
	return nil
}

var _ knftables.Interface = (*textNFT)(nil)

// elementRE matches one "add element" command of one element, as knftables writes it.
var elementRE = regexp.MustCompile(`^add element (\S+ \S+ \S+) \{ (.*) \}$`)

// groupText returns the text of an ungrouped transaction with runs of "add element"
// commands of the same set or map merged, n elements to a command: what a Syncer
// grouping by n must write.
func groupText(ungrouped string, n int) string {
	var out []string
	var cont string
	var elems []string
	flush := func() {
		if len(elems) > 0 {
			out = append(out, fmt.Sprintf("add element %s { %s }", cont, strings.Join(elems, ", ")))
		}
		elems = nil
	}
	for _, l := range strings.Split(strings.TrimSuffix(ungrouped, "\n"), "\n") {
		m := elementRE.FindStringSubmatch(l)
		if m == nil {
			flush()
			out = append(out, l)
			continue
		}
		if m[1] != cont || len(elems) == n {
			flush()
		}
		cont = m[1]
		elems = append(elems, m[2])
	}
	flush()
	return strings.Join(out, "\n") + "\n"
}

// ungroupedText returns the transaction knftables writes for adding rs to an empty
// table, one element per command, and its number of operations.
func ungroupedText(rs *ruleset.Ruleset) (string, int) {
	tx := knftables.NewFake(rs.Family, rs.Table).NewTransaction()
	rs.AddTo(tx)
	return tx.String(), tx.NumOperations()
}

func TestGroupedElementsText(t *testing.T) {
	rs := ruleset.New(fam, table)
	rs.AddSet(&knftables.Set{Name: "ips", Type: "ipv4_addr"})
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		rs.AddElement(&knftables.Element{Set: "ips", Key: []string{ip}})
	}
	rs.AddSet(&knftables.Set{Name: "pairs", Type: "ipv4_addr . inet_service"})
	rs.AddElement(&knftables.Element{Set: "pairs", Key: []string{"10.0.0.1", "80"}, Comment: knftables.PtrTo("a")})
	rs.AddElement(&knftables.Element{Set: "pairs", Key: []string{"10.0.0.2", "80"}, Comment: knftables.PtrTo(`b "quoted"`)})
	rs.AddMap(&knftables.Map{Name: "dnat", Type: "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service"})
	for i := range 5 {
		var c *string
		if i%2 == 0 {
			c = knftables.PtrTo(fmt.Sprintf("ns/svc-%d:http", i))
		}
		rs.AddElement(&knftables.Element{Map: "dnat", Key: []string{fmt.Sprintf("172.30.0.%d", i), "tcp", "80"},
			Value: []string{fmt.Sprintf("10.1.0.%d", i), "8080"}, Comment: c})
	}
	n := newTextNFT(fam, table)
	s := New(n, WithElementGroup(2))
	res, err := s.Sync(context.Background(), rs)
	if err != nil {
		t.Fatal(err)
	}
	want := `add table ip synctest
add table ip synctest
add set ip synctest ips { type ipv4_addr ; }
add set ip synctest pairs { type ipv4_addr . inet_service ; }
add map ip synctest dnat { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service ; }
add element ip synctest dnat { 172.30.0.0 . tcp . 80 comment "ns/svc-0:http" : 10.1.0.0 . 8080, 172.30.0.1 . tcp . 80 : 10.1.0.1 . 8080 }
add element ip synctest dnat { 172.30.0.2 . tcp . 80 comment "ns/svc-2:http" : 10.1.0.2 . 8080, 172.30.0.3 . tcp . 80 : 10.1.0.3 . 8080 }
add element ip synctest dnat { 172.30.0.4 . tcp . 80 comment "ns/svc-4:http" : 10.1.0.4 . 8080 }
add element ip synctest ips { 10.0.0.1, 10.0.0.2 }
add element ip synctest ips { 10.0.0.3 }
add element ip synctest pairs { 10.0.0.1 . 80 comment "a", 10.0.0.2 . 80 comment "b \"quoted\"" }
`
	if diff := cmp.Diff(want, n.runs[0]); diff != "" {
		t.Errorf("grouped full sync (-want +got):\n%s", diff)
	}
	ungrouped, ops := ungroupedText(rs)
	// The full sync adds the table, then the whole ruleset (which adds it again).
	if diff := cmp.Diff("add table ip synctest\n"+groupText(ungrouped, 2), n.runs[0]); diff != "" {
		t.Errorf("grouped full sync vs knftables's ungrouped text, merged (-want +got):\n%s", diff)
	}
	if res.Operations != ops+1 {
		t.Errorf("Operations = %d; want %d, as for the ungrouped transaction", res.Operations, ops+1)
	}
}

// TestGroupedFullSyncOfABuiltRuleset checks a grouped full sync of a real ruleset
// (dispatch maps with comments, maps with concatenated values, sets) — the normal
// one over an existing table, and the fallback that recreates the table — against
// knftables's own text of the same elements.
func TestGroupedFullSyncOfABuiltRuleset(t *testing.T) {
	rs := ruleset.Build(cluster(400), testConfig, knftables.IPv4Family)
	ungrouped, ops := ungroupedText(rs)
	if !strings.Contains(ungrouped, ` comment "`) {
		t.Fatalf("the ruleset has no element comments; the test needs some")
	}
	tableLine, _, _ := strings.Cut(ungrouped, "\n")
	for _, group := range []int{1, 7, DefaultElementGroup} {
		t.Run(fmt.Sprint(group), func(t *testing.T) {
			n := newTextNFT(rs.Family, rs.Table)
			n.existing = map[string][]string{"chain": {"stale-chain"}}
			n.fail = 1
			s := New(n, WithElementGroup(group))
			res, err := s.Sync(context.Background(), rs)
			if err != nil {
				t.Fatal(err)
			}
			if len(n.runs) != 2 {
				t.Fatalf("%d nft runs; want 2 (the full sync, failed, then the fallback)", len(n.runs))
			}
			// The first transaction: flush, add everything, delete the stale chain.
			first := n.runs[0]
			prefix := tableLine + "\nflush chain ip " + rs.Table + " stale-chain\n"
			suffix := "delete chain ip " + rs.Table + " stale-chain\n"
			if !strings.HasPrefix(first, prefix) || !strings.HasSuffix(first, suffix) {
				t.Fatalf("first transaction does not flush and delete the stale chain:\n%.500s", first)
			}
			if diff := cmp.Diff(groupText(ungrouped, group), strings.TrimSuffix(strings.TrimPrefix(first, prefix), suffix)); diff != "" {
				t.Errorf("full sync (-want +got):\n%s", diff)
			}
			// The fallback: delete the table, add everything.
			second := n.runs[1]
			prefix = tableLine + "\ndelete table ip " + rs.Table + "\n"
			if !strings.HasPrefix(second, prefix) {
				t.Fatalf("fallback does not recreate the table:\n%.500s", second)
			}
			if diff := cmp.Diff(groupText(ungrouped, group), strings.Replace(second, prefix, "", 1)); diff != "" {
				t.Errorf("fallback (-want +got):\n%s", diff)
			}
			if res.Operations != ops+2 {
				t.Errorf("Operations = %d; want %d (the ungrouped count, plus add and delete table)", res.Operations, ops+2)
			}
			if group > 1 && strings.Count(second, "\n") >= strings.Count(ungrouped, "\n") {
				t.Errorf("grouping by %d did not cut the number of commands", group)
			}
		})
	}
}

// embeddedFake is a test double in the style of proxier's flakyNFT: a Fake with
// some methods overridden.
type embeddedFake struct{ *knftables.Fake }

func TestNewGroupsOnlyForARealNFT(t *testing.T) {
	for _, tc := range []struct {
		name string
		nft  knftables.Interface
		opts []Option
		want int
	}{
		{"Fake", knftables.NewFake(fam, table), nil, 1},
		{"embedded Fake", embeddedFake{knftables.NewFake(fam, table)}, nil, 1},
		{"other", newTextNFT(fam, table), nil, DefaultElementGroup},
		{"other, option", newTextNFT(fam, table), []Option{WithElementGroup(50)}, 50},
		{"other, option 0", newTextNFT(fam, table), []Option{WithElementGroup(0)}, 1},
		{"Fake, option", knftables.NewFake(fam, table), []Option{WithElementGroup(50)}, 50},
	} {
		if got := New(tc.nft, tc.opts...).group; got != tc.want {
			t.Errorf("%s: group = %d; want %d", tc.name, got, tc.want)
		}
	}
}

// dynamicRuleset is baseRuleset with a dynamic set "aff" (timeout to), filled at run
// time by a rule, and a static set "static" with one element.
func dynamicRuleset(to time.Duration) *ruleset.Ruleset {
	rs := baseRuleset()
	rs.AddSet(&knftables.Set{Name: "aff", Type: "ipv4_addr",
		Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: &to})
	rs.AddSet(&knftables.Set{Name: "static", Type: "ipv4_addr"})
	rs.AddElement(&knftables.Element{Set: "static", Key: []string{"10.9.9.9"}})
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
