package ruleset

import (
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// minClaims is the ClaimTable of Build, which only needs the best claimant of each
// key: pre, the ClusterIP claims, overlaid with the claims settled since.
type minClaims struct {
	pre  map[string]Claimant
	over map[string]Claimant
	// undo holds what over had for the keys of the fragment being settled.
	undo map[string]*Claimant
}

// Best implements ClaimTable.
func (m *minClaims) Best(key string) (Claimant, bool) {
	c, ok := m.over[key]
	if p, pok := m.pre[key]; pok && (!ok || CompareClaimants(p, c) < 0) {
		return p, true
	}
	return c, ok
}

// Add implements ClaimTable.
func (m *minClaims) Add(key string, c Claimant) bool {
	if best, ok := m.Best(key); ok && CompareClaimants(best, c) <= 0 {
		return false // not better than the best, which is all that is kept
	}
	if _, ok := m.undo[key]; !ok {
		if old, had := m.over[key]; had {
			m.undo[key] = &old
		} else {
			m.undo[key] = nil
		}
	}
	m.over[key] = c
	return true
}

// Remove implements ClaimTable.
func (m *minClaims) Remove(key string, _ Claimant) {
	if old, ok := m.undo[key]; ok {
		if old == nil {
			delete(m.over, key)
		} else {
			m.over[key] = *old
		}
		delete(m.undo, key)
	}
}

// buildMerged is Build: the ruleset built from scratch, its fragments merged as
// they are settled, without the index of a changeset.Builder. The fragments are
// merged in owner order (the node's objects, then the Services by
// "namespace/name"), the first version of an object kept, as the Builder keeps
// its first owner's. Of two Services with the same owner name ("a/b" + "c" and
// "a" + "b/c"), the later in Service order comes first, as it does in the
// Builder, whose later owner of a name takes the place of the earlier.
func buildMerged(st *state.ClusterState, cfg Config, family knftables.Family) *Ruleset {
	rs := New(family, cfg.Table)
	rs.Comment = TableComment
	mergeFragment(rs, BuildBase(cfg, family, st))

	svcs := SortedServices(st)
	// order lists the Services by owner name, the order of merging.
	owners := make([]string, len(svcs))
	order := make([]int, len(svcs))
	for i, svc := range svcs {
		owners[i], order[i] = svc.Name.String(), i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := strings.Compare(owners[a], owners[b]); c != 0 {
			return c
		}
		return b - a
	})

	preLists := make([][]claimRec, len(svcs))
	pre := preClaim(family, svcs, func(i int, key string, c Claimant) {
		preLists[i] = append(preLists[i], claimRec{key: key, c: c})
	})
	t := &minClaims{pre: pre, over: map[string]Claimant{}, undo: map[string]*Claimant{}}
	ready := make([]*Ruleset, len(svcs))
	done := make([]bool, len(svcs))
	next := 0
	// The element maps are left to grow: a large map presized from an estimate
	// rounds its tables up to powers of two, and held more slots than one grown
	// table by table.
	merge := func(i int, f *Fragment) {
		clear(t.undo)
		ready[i], done[i] = f.Objects, true
		for next < len(order) && done[order[next]] {
			j := order[next]
			if ready[j] != nil {
				mergeFragment(rs, ready[j])
				ready[j] = nil
			}
			next++
		}
	}
	fb := &fragmentBuild{cfg: cfg, family: family, st: st, svcs: svcs, pre: pre, preLists: preLists, t: t, use: merge}
	if !fb.run() {
		// BuildService and preClaim make the ClusterIP claims with the same code.
		panic("ruleset.Build: a Service's ClusterIP claims differ from those registered beforehand")
	}
	mergeFragment(rs, DispatchChainsOf(rs))
	return rs
}

// mergeFragment adds the objects of frag that rs does not have yet.
func mergeFragment(rs, frag *Ruleset) {
	for n, c := range frag.Chains {
		if _, ok := rs.Chains[n]; !ok {
			rs.Chains[n] = c
		}
	}
	for n, s := range frag.Sets {
		if _, ok := rs.Sets[n]; !ok {
			rs.Sets[n] = s
		}
	}
	for n, m := range frag.Maps {
		if _, ok := rs.Maps[n]; !ok {
			rs.Maps[n] = m
		}
	}
	for _, x := range frag.Listed() {
		es := rs.Elements[x.Cont]
		if es == nil {
			es = map[string]Elem{}
			rs.Elements[x.Cont] = es
		}
		if _, ok := es[x.Key]; !ok {
			es[x.Key] = x.Elem
		}
	}
}
