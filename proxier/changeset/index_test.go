package changeset

import (
	"fmt"
	"testing"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestIndexIsFirstUpdate checks that a Builder started with Index holds the ruleset
// a first Update gives and reports the same Deltas afterwards, whether its first
// build ran in parallel or not; and that Index on a Builder already in use leaves
// the next Delta as Update(st, nil) would.
func TestIndexIsFirstUpdate(t *testing.T) {
	cfg := baseConfig()
	cfg.Defaults()
	for seed := range uint64(12) {
		r, st := randomCluster(seed, 17)
		fam := dual[seed%2]
		upd, idx := NewBuilder(cfg, fam), NewBuilder(cfg, fam)
		want, _ := upd.Update(st, nil)
		sameRuleset(t, fmt.Sprintf("seed %d Index", seed), want, idx.Index(st))
		for step := range 20 {
			changed := map[state.ServiceName]bool{}
			changed[randomChange(st, r)] = true
			what := fmt.Sprintf("seed %d step %d", seed, step)
			if step == 10 {
				// Index on a Builder in use: its Delta is dropped, the next one
				// starts from the state it indexed.
				upd.Update(st, nil)
				idx.Index(st)
				continue
			}
			wantRS, wantD := upd.Update(st, changed)
			gotRS, gotD := idx.Update(st, changed)
			sameRuleset(t, what, wantRS, gotRS)
			sameDelta(t, what, wantD, gotD)
		}
	}
}

// TestDropGoneMapped runs the churn against the original Builder with every
// rebuild's gone elements found through a map, the path of large Services.
func TestDropGoneMapped(t *testing.T) {
	saved := dropScan
	dropScan = 0
	defer func() { dropScan = saved }()
	TestBuilderChurnMatchesOriginal(t)
}
