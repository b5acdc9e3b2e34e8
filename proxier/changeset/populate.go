package changeset

import (
	"slices"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// populate is the first Update of b, for every Service of st, built in parallel
// as ruleset.BuildFragments does it. It returns false, leaving b empty, when b
// must build sequentially.
func (b *Builder) populate(st *state.ClusterState) bool {
	b.fresh = true
	b.rs.Comment = ruleset.TableComment
	b.node = st.Node
	b.base = b.newOwner("")
	b.replace(b.base, ruleset.BuildBase(b.cfg, b.family, st))

	svcs := ruleset.SortedServices(st)
	t := &builderClaims{b: b}
	b.svcs = make(map[state.ServiceName]*owner, len(svcs))
	b.claims = make(map[string]*claimSet, len(svcs))
	for _, svc := range svcs {
		b.svcs[svc.Name] = b.newOwner(svc.Name.String())
	}
	// The element maps are left to grow: a large map presized from an estimate
	// rounds its tables up to powers of two, and held more slots than one grown
	// table by table.
	ok := ruleset.BuildFragments(b.cfg, b.family, st, svcs, t, func(_ int, f *ruleset.Fragment) {
		if f.Objects == nil {
			b.freeOwner(b.svcs[f.Service.Name])
			delete(b.svcs, f.Service.Name)
		} else {
			b.replace(b.svcs[f.Service.Name], f.Objects)
		}
	})
	if !ok {
		*b = *NewBuilder(b.cfg, b.family)
	}
	return ok
}

// builderClaims is the ruleset.ClaimTable of a Builder's first build: its own
// claims.
type builderClaims struct {
	b *Builder
}

// Best implements ruleset.ClaimTable.
func (t *builderClaims) Best(key string) (ruleset.Claimant, bool) {
	if set := t.b.claims[key]; set != nil && len(set.cs) > 0 {
		return set.cs[0], true
	}
	return ruleset.Claimant{}, false
}

// Add implements ruleset.ClaimTable.
func (t *builderClaims) Add(key string, c ruleset.Claimant) bool {
	set := t.b.claims[key]
	if set == nil {
		set = &claimSet{key: key}
		t.b.claims[key] = set
	}
	i, found := slices.BinarySearchFunc(set.cs, c, ruleset.CompareClaimants)
	if found {
		return false
	}
	set.cs = slices.Insert(set.cs, i, c)
	o := t.b.svcs[c.Service]
	o.claims = append(o.claims, set)
	return true
}

// Remove implements ruleset.ClaimTable.
func (t *builderClaims) Remove(key string, c ruleset.Claimant) {
	set := t.b.claims[key]
	if i, found := slices.BinarySearchFunc(set.cs, c, ruleset.CompareClaimants); found {
		set.cs = slices.Delete(set.cs, i, i+1)
	}
	if len(set.cs) == 0 {
		delete(t.b.claims, key)
	}
	// The removes come in the reverse order of the adds: the set is o's last.
	o := t.b.svcs[c.Service]
	o.claims = o.claims[:len(o.claims)-1]
}
