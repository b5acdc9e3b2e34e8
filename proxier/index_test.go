package proxier

import (
	"runtime/debug"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
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
