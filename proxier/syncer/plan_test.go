package syncer

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// planSteps are the endpoint counts a Service goes through in the plan tests, and
// whether each step's plan is element operations only (a netlink batch).
var planSteps = []struct {
	endpoints int
	netlink   bool
}{
	{3, true},   // other endpoint addresses of a count in use
	{17, false}, // a count not in use: new chains, sets and maps
	{3, true},   // back: the dnat-17 objects are kept, emptied element by element
	{17, true},  // the kept objects taken back
	{0, false},  // no endpoints: a dispatch rule for a class not in use yet
	{2, true},
}

// runPlanSteps applies the Builder's first ruleset, then planSteps (a full sync
// requested before the fourth step), to every Syncer of ss, and calls check after
// each step with the step's number (-1 for the first sync) and every Syncer's
// Result.
func runPlanSteps(t *testing.T, ss []*Syncer, check func(step int, res []Result)) {
	t.Helper()
	ctx := context.Background()
	st := cluster(40)
	b := changeset.NewBuilder(testConfig, knftables.IPv4Family)
	apply := func(step int, rs *ruleset.Ruleset, d *changeset.Delta) {
		t.Helper()
		var res []Result
		for i, s := range ss {
			r, err := s.Apply(ctx, rs, d)
			if err != nil {
				t.Fatalf("step %d, syncer %d: %v", step, i, err)
			}
			res = append(res, r)
		}
		check(step, res)
	}
	rs, d := b.Update(st, nil)
	apply(-1, rs, d)
	name := state.ServiceName{Namespace: "ns", Name: "svc-5"}
	for step, tc := range planSteps {
		if step == 3 {
			for _, s := range ss {
				s.RequestFullSync()
			}
		}
		st = clone(st)
		setEndpoints(st, name, 100+step, tc.endpoints)
		rs, d = b.Update(st, map[state.ServiceName]bool{name: true})
		apply(step, rs, d)
	}
}

// TestDecodedNetlinkEqualsNFT applies the same syncs to two Fakes, one with
// DecodedNetlink, one through nft only: the plans are the same, and so are the
// tables after every step; the netlink Syncer sends exactly the element-only
// plans as batches.
func TestDecodedNetlinkEqualsNFT(t *testing.T) {
	viaNetlink := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	viaNFT := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	ss := []*Syncer{New(viaNetlink, WithNetlink(DecodedNetlink(viaNetlink))), New(viaNFT)}
	runPlanSteps(t, ss, func(step int, res []Result) {
		// A Fake dumps elements in the order they were added, which a batch does not
		// keep.
		lines := func(f *knftables.Fake) []string { return sorted(strings.Split(f.Dump(), "\n")) }
		if diff := cmp.Diff(lines(viaNFT), lines(viaNetlink)); diff != "" {
			t.Fatalf("step %d: the table written with netlink batches differs (-nft +netlink):\n%s", step, diff)
		}
		nl, plain := res[0], res[1]
		if nl.Operations != plain.Operations || nl.Full != plain.Full || nl.Deleted != plain.Deleted {
			t.Errorf("step %d: results %+v and %+v; want the same plan", step, nl, plain)
		}
		if plain.NetlinkElements != 0 {
			t.Errorf("step %d: %d elements over netlink without a transport", step, plain.NetlinkElements)
		}
		// The first sync loads its elements as a batch; the full sync of step 3 brings
		// back chains and sets, so it goes through nft alone (see Syncer.fullSync).
		want := step < 0 || step != 3 && planSteps[step].netlink
		if got := nl.NetlinkElements > 0; got != want {
			t.Errorf("step %d: %d elements over netlink; want netlink %v", step, nl.NetlinkElements, want)
		}
	})
}

// TestKernelAndFakeGetTheSamePlans applies the same syncs, with netlink batches,
// to a kernel table and to a Fake: after every step the two hold the same chains,
// sets and maps, and the same elements, so that what the simulator traces (the
// Fake) is what the kernel got.
func TestKernelAndFakeGetTheSamePlans(t *testing.T) {
	_, nft, kernel := netlinkSyncer(t, "plansk", knftables.IPv4Family)
	fake := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
	ss := []*Syncer{kernel, New(fake, WithNetlink(DecodedNetlink(fake)))}
	runPlanSteps(t, ss, func(step int, res []Result) {
		if res[0].Operations != res[1].Operations || res[0].NetlinkElements != res[1].NetlinkElements {
			t.Errorf("step %d: kernel %+v, Fake %+v; want the same plan", step, res[0], res[1])
		}
		if diff := cmp.Diff(tableContents(t, fake), tableContents(t, nft)); diff != "" {
			t.Fatalf("step %d: the kernel's table differs from the Fake's (-fake +kernel):\n%s", step, diff)
		}
	})
}

// tableContents lists a table through nft: its chains, sets and maps by name,
// and the elements of each set and map (key, comment and value), sorted.
func tableContents(t *testing.T, nft knftables.Interface) map[string][]string {
	t.Helper()
	ctx := context.Background()
	out := map[string][]string{}
	for _, kind := range []string{"chain", "set", "map"} {
		names, err := nft.List(ctx, kind)
		if err != nil {
			t.Fatal(err)
		}
		out[kind] = sorted(named(names))
		if kind == "chain" {
			continue
		}
		for _, name := range out[kind] {
			es, err := nft.ListElements(ctx, kind, name)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range es {
				s := strings.Join(e.Key, " . ")
				if e.Comment != nil {
					s += fmt.Sprintf(" comment %q", *e.Comment)
				}
				if len(e.Value) > 0 {
					s += " : " + strings.Join(e.Value, " . ")
				}
				got = append(got, s)
			}
			out[kind+" "+name] = sorted(got)
		}
	}
	return out
}
