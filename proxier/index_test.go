package proxier

import (
	"context"
	"runtime/debug"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// TestIndexBuilderRestoresGCPercent checks that IndexBuilder builds the Builder's
// ruleset and leaves the process's garbage collector target as it found it: the
// default, a lower one set by the process, and off.
func TestIndexBuilderRestoresGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, pct := range []int{100, 20, -1} {
		debug.SetGCPercent(pct)
		b := changeset.NewBuilder(ruleset.Config{Table: testTable}, knftables.IPv4Family)
		rs := IndexBuilder(b, state.NewClusterState())
		if got := debug.SetGCPercent(100); got != pct {
			t.Errorf("GC percent %d before IndexBuilder, %d after", pct, got)
		}
		if rs == nil || len(rs.Chains) == 0 {
			t.Errorf("GC percent %d: IndexBuilder built no base chains: %+v", pct, rs)
		}
	}
}

// TestLowerGC checks the target in force between lowerGC and its restore: the
// lower of the process's and the phase's, or off when the process has it off;
// and the process's own afterwards.
func TestLowerGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	cases := []struct{ process, phase, during int }{
		{100, writeGCPercent, writeGCPercent},
		{100, indexGCPercent, indexGCPercent},
		{40, writeGCPercent, 40},
		{40, indexGCPercent, indexGCPercent},
		{-1, indexGCPercent, -1},
	}
	for _, c := range cases {
		debug.SetGCPercent(c.process)
		restore := lowerGC(c.phase)
		during := debug.SetGCPercent(c.during) // read it, leaving it as it was
		restore()
		after := debug.SetGCPercent(100)
		if during != c.during || after != c.process {
			t.Errorf("process %d, phase %d: %d during, %d after; want %d, %d",
				c.process, c.phase, during, after, c.during, c.process)
		}
	}
}

// TestFirstSyncHooks checks what FirstSync reports of its phases (the proxier's
// first sync is tested through the Proxier): the hooks run in order, the Written
// one with the table already holding the Service, and every phase is timed.
func TestFirstSyncHooks(t *testing.T) {
	ctx := context.Background()
	st := fixture.NewCluster()
	fixture.AddService(st, "ns/web", "172.30.0.10", fixture.Ports(fixture.TCP("http", 80, 0)))
	cfg := ruleset.Config{Table: testTable}
	fake := knftables.NewFake(knftables.IPv4Family, testTable)
	s := syncer.New(fake, syncer.WithNetlink(syncer.DecodedNetlink(fake)))
	var order []string
	res, times, err := FirstSync(ctx, s, changeset.NewBuilder(cfg, knftables.IPv4Family), st, cfg, knftables.IPv4Family, FirstSyncHooks{
		Written: func() {
			order = append(order, "written")
			if !strings.Contains(fake.Dump(), "172.30.0.10") {
				t.Error("Written ran before the table held the Service")
			}
		},
		Indexed: func() { order = append(order, "indexed") },
	})
	if err != nil || !res.Full || !times.Indexed || times.Build <= 0 || times.Write <= 0 || times.Index <= 0 {
		t.Fatalf("FirstSync: %+v, %+v, %v; want a full sync, indexed, each phase timed", res, times, err)
	}
	if strings.Join(order, ",") != "written,indexed" {
		t.Errorf("hooks ran %v; want written, then indexed", order)
	}
}
