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
	for _, pct := range []int{100, 30, -1} {
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
