package ruleset

import (
	"runtime"
	"slices"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// A first build (Build, or a Builder's first Update) builds every Service's
// fragment, which is most of its cost, and fragments only depend on one another
// through frontend claims. The claims of the sequential build are reproduced
// exactly without building in order:
//
//   - every ClusterIP claim (priority 0) of every Service is registered first: the
//     sequential build would have them all in the end, and they beat every other
//     claim whatever the Service order;
//   - fragments are built in parallel, each answered from those ClusterIP claims
//     and its own earlier claims only, which misses just the other frontends two
//     Services claim at once (the same ExternalIP, LoadBalancer IP or node port);
//   - on the calling goroutine, in Service order, each fragment's claims are
//     settled against all the claims so far, as the sequential build would have
//     answered them; a fragment built with a wrong answer is built again there.
//
// buildService must therefore stay safe for concurrent use: it reads its
// arguments and writes only the Ruleset it returns.

// claimRec is one claim made while building a fragment and the answer it got.
type claimRec struct {
	key  string
	c    claimant
	owns bool
}

// fragment is one Service's fragment from a first build, with its claims.
type fragment struct {
	svc    *state.Service
	rs     *Ruleset
	claims []claimRec
	// pre are the Service's ClusterIP claims preClaim registered.
	pre []claimRec
}

// claimTable is the registry of claims a first build settles fragments against.
type claimTable interface {
	// best returns the best claimant of key, if any.
	best(key string) (claimant, bool)
	// add registers c on key, reporting whether that changed the table.
	add(key string, c claimant) bool
	// remove undoes add(key, c) that reported a change; the removes of a fragment
	// come in the reverse order of its adds.
	remove(key string, c claimant)
}

// parallelMin is the number of Services from which a first build uses several
// goroutines; tests lower it.
var parallelMin = 512

// fragmentBatch is the number of Services a worker builds at a time.
const fragmentBatch = 64

// freshBuild builds the fragments of svcs (in Service order) for a first build and
// hands them to use, in order, on the calling goroutine, their claims registered in
// t. pre holds the best ClusterIP claim of each frontend key and preLists the
// ClusterIP claims of each Service, as preClaim computed them. It
// returns false, having stopped early, when a fragment breaks the assumptions
// above (its ClusterIP claims are not those of preClaim): the caller must then
// build sequentially.
func freshBuild(cfg Config, family knftables.Family, st *state.ClusterState, svcs []*state.Service,
	pre map[string]claimant, preLists [][]claimRec, t claimTable, use func(i int, f *fragment)) bool {
	build := func(i int, f *fragment) {
		svc := svcs[i]
		f.svc, f.pre = svc, preLists[i]
		f.rs = buildService(cfg, family, st, svc, func(key []string, id string, prio int) bool {
			k := strings.Join(key, " . ")
			c := claimant{prio: prio, id: id, svc: svc.Name}
			best, ok := pre[k]
			if !ok || compareClaimants(c, best) < 0 {
				best = c
			}
			for _, r := range f.claims {
				if r.key == k && compareClaimants(r.c, best) < 0 {
					best = r.c
				}
			}
			owns := best.svc == svc.Name && best.id == id
			f.claims = append(f.claims, claimRec{key: k, c: c, owns: owns})
			return owns
		})
	}
	settle := func(i int, f *fragment) bool {
		if !settleClaims(t, f) {
			// Built with a wrong answer: build it again, answered exactly.
			*f = fragment{svc: f.svc, pre: f.pre}
			n := f.svc.Name
			f.rs = buildService(cfg, family, st, f.svc, func(key []string, id string, prio int) bool {
				k := strings.Join(key, " . ")
				c := claimant{prio: prio, id: id, svc: n}
				t.add(k, c)
				best, _ := t.best(k)
				owns := best.svc == n && best.id == id
				f.claims = append(f.claims, claimRec{key: k, c: c, owns: owns})
				return owns
			})
		}
		if !clusterIPClaimsAsPre(f) {
			return false
		}
		use(i, f)
		return true
	}

	workers := runtime.GOMAXPROCS(0)
	if workers < 2 || len(svcs) < parallelMin {
		for i := range svcs {
			var f fragment
			build(i, &f)
			if !settle(i, &f) {
				return false
			}
		}
		return true
	}

	type batch struct {
		lo    int
		frags []fragment
		done  chan struct{}
	}
	jobs := make(chan *batch, workers)
	// pending bounds how far the workers run ahead of the settling.
	pending := make(chan *batch, 4*workers)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	go func() {
		defer close(pending)
		defer close(jobs)
		for lo := 0; lo < len(svcs); lo += fragmentBatch {
			bt := &batch{lo: lo, frags: make([]fragment, min(fragmentBatch, len(svcs)-lo)), done: make(chan struct{})}
			select {
			case pending <- bt:
			case <-stop:
				return
			}
			jobs <- bt
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for bt := range jobs {
				for j := range bt.frags {
					select {
					case <-stop:
					default:
						build(bt.lo+j, &bt.frags[j])
					}
				}
				close(bt.done)
			}
		}()
	}
	ok := true
	for bt := range pending {
		<-bt.done
		if !ok {
			continue
		}
		for j := range bt.frags {
			if !settle(bt.lo+j, &bt.frags[j]) {
				ok = false
				close(stop)
				break
			}
			bt.frags[j] = fragment{}
		}
	}
	wg.Wait()
	return ok
}

// settleClaims registers the claims of f in t in the order f made them, and
// reports whether each got the answer the sequential build would have given it
// (the claims of the Services before f's and f's own so far decide). When one did
// not, it withdraws the claims it registered.
func settleClaims(t claimTable, f *fragment) bool {
	n := f.svc.Name
	var added []int
	for i, r := range f.claims {
		if t.add(r.key, r.c) {
			added = append(added, i)
		}
		best, _ := t.best(r.key)
		if (best.svc == n && best.id == r.c.id) != r.owns {
			for _, j := range slices.Backward(added) {
				t.remove(f.claims[j].key, f.claims[j].c)
			}
			return false
		}
	}
	return true
}

// clusterIPClaimsAsPre reports whether the ClusterIP claims (priority 0) f made are
// exactly those preClaim registered for its Service.
func clusterIPClaimsAsPre(f *fragment) bool {
	if f.rs == nil {
		return len(f.pre) == 0 && len(f.claims) == 0
	}
	same := func(a claimRec) func(claimRec) bool {
		return func(b claimRec) bool { return a.key == b.key && a.c == b.c }
	}
	for _, r := range f.claims {
		if r.c.prio == 0 && !slices.ContainsFunc(f.pre, same(r)) {
			return false
		}
	}
	for _, r := range f.pre {
		if !slices.ContainsFunc(f.claims, same(r)) {
			return false
		}
	}
	return true
}

// preClaim calls add for every ClusterIP claim of every Service of svcs (i its
// index), as buildService makes them, and returns the best claimant of each key.
func preClaim(family knftables.Family, svcs []*state.Service, add func(i int, key string, c claimant)) map[string]claimant {
	best := map[string]claimant{}
	for i, svc := range svcs {
		b := &builder{fam: newFamilyInfo(family), claimer: func(key []string, id string, prio int) bool {
			k := strings.Join(key, " . ")
			c := claimant{prio: prio, id: id, svc: svc.Name}
			if cur, ok := best[k]; !ok || compareClaimants(c, cur) < 0 {
				best[k] = c
			}
			add(i, k, c)
			return false
		}}
		b.claimClusterIPs([]*state.Service{svc})
	}
	return best
}

// sortedServices returns the Services of st in name order.
func sortedServices(st *state.ClusterState) []*state.Service {
	names := make([]state.ServiceName, 0, len(st.Services))
	for n := range st.Services {
		names = append(names, n)
	}
	sortNames(names)
	svcs := make([]*state.Service, len(names))
	for i, n := range names {
		svcs[i] = st.Services[n]
	}
	return svcs
}

// minClaims is the claimTable of Build, which only needs the best claimant of each
// key: pre, the ClusterIP claims, overlaid with the claims settled since.
type minClaims struct {
	pre  map[string]claimant
	over map[string]claimant
	// undo holds what over had for the keys of the fragment being settled.
	undo map[string]*claimant
}

func (m *minClaims) best(key string) (claimant, bool) {
	c, ok := m.over[key]
	if p, pok := m.pre[key]; pok && (!ok || compareClaimants(p, c) < 0) {
		return p, true
	}
	return c, ok
}

func (m *minClaims) add(key string, c claimant) bool {
	if best, ok := m.best(key); ok && compareClaimants(best, c) <= 0 {
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

func (m *minClaims) remove(key string, _ claimant) {
	if old, ok := m.undo[key]; ok {
		if old == nil {
			delete(m.over, key)
		} else {
			m.over[key] = *old
		}
		delete(m.undo, key)
	}
}

// buildFresh is Build: the ruleset built from scratch without a Builder's index.
// The fragments are merged in owner order (the node's objects, then the Services
// by "namespace/name"), the first version of an object kept, as the Builder keeps
// its first owner's. It returns nil when a Builder must do it.
func buildFresh(st *state.ClusterState, cfg Config, family knftables.Family) *Ruleset {
	rs := New(family, cfg.Table)
	rs.Comment = TableComment
	mergeFragment(rs, buildBase(cfg, family, st.Node))

	svcs := sortedServices(st)
	// order lists the Services by owner name, the order of merging.
	owners := make([]string, len(svcs))
	order := make([]int, len(svcs))
	for i, svc := range svcs {
		owners[i], order[i] = svc.Name.String(), i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(owners[a], owners[b]) })
	for k := 1; k < len(order); k++ {
		if owners[order[k]] == owners[order[k-1]] {
			return nil // two Services named alike: the Builder knows their order
		}
	}

	preLists := make([][]claimRec, len(svcs))
	pre := preClaim(family, svcs, func(i int, key string, c claimant) {
		preLists[i] = append(preLists[i], claimRec{key: key, c: c})
	})
	t := &minClaims{pre: pre, over: map[string]claimant{}, undo: map[string]*claimant{}}
	ready := make([]*Ruleset, len(svcs))
	done := make([]bool, len(svcs))
	next := 0
	sizer := newSizer(len(svcs))
	ok := freshBuild(cfg, family, st, svcs, pre, preLists, t, func(i int, f *fragment) {
		clear(t.undo)
		ready[i], done[i] = f.rs, true
		for next < len(order) && done[order[next]] {
			j := order[next]
			if ready[j] != nil {
				mergeFragment(rs, ready[j])
				ready[j] = nil
			}
			next++
			if sizer.step() {
				for c, es := range rs.Elements {
					if n := sizer.estimate(len(es)); n > 0 {
						rs.Elements[c] = presized(es, n)
					}
				}
			}
		}
	})
	if !ok {
		return nil
	}
	mergeFragment(rs, dispatchChainsOf(rs))
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
	for c, fes := range frag.Elements {
		es := rs.Elements[c]
		if es == nil {
			es = make(map[string]*knftables.Element, len(fes))
			rs.Elements[c] = es
		}
		for k, e := range fes {
			if _, ok := es[k]; !ok {
				es[k] = e
			}
		}
	}
}

// firstBuild is the first Update of b, for every Service of st, built as fresh.go
// describes. It returns false, leaving b empty, when b must build sequentially.
func (b *Builder) firstBuild(st *state.ClusterState) bool {
	b.fresh = true
	b.rs.Comment = TableComment
	b.node = st.Node
	b.base = &owner{}
	b.replace(b.base, buildBase(b.cfg, b.family, st.Node))

	svcs := sortedServices(st)
	t := &builderClaims{b: b}
	preLists := make([][]claimRec, len(svcs))
	b.svcs = make(map[state.ServiceName]*owner, len(svcs))
	b.claims = make(map[string]*claimSet, len(svcs))
	for _, svc := range svcs {
		b.svcs[svc.Name] = &owner{name: svc.Name.String()}
	}
	pre := preClaim(b.family, svcs, func(i int, key string, c claimant) {
		preLists[i] = append(preLists[i], claimRec{key: key, c: c})
		t.add(key, c)
	})
	sizer := newSizer(len(svcs))
	ok := freshBuild(b.cfg, b.family, st, svcs, pre, preLists, t, func(_ int, f *fragment) {
		if f.rs == nil {
			delete(b.svcs, f.svc.Name)
		} else {
			b.replace(b.svcs[f.svc.Name], f.rs)
		}
		if sizer.step() {
			for _, t := range b.elems {
				if n := sizer.estimate(len(t.entries)); n > 0 {
					t.entries = presized(t.entries, n)
					if t.out != nil {
						t.out = presized(t.out, n)
						b.rs.Elements[t.name] = t.out
					}
				}
			}
		}
	})
	if !ok {
		*b = *NewBuilder(b.cfg, b.family)
	}
	return ok
}

// builderClaims is the claimTable of a Builder's first build: its own claims.
type builderClaims struct {
	b *Builder
}

func (t *builderClaims) best(key string) (claimant, bool) {
	if set := t.b.claims[key]; set != nil && len(set.cs) > 0 {
		return set.cs[0], true
	}
	return claimant{}, false
}

func (t *builderClaims) add(key string, c claimant) bool {
	set := t.b.claims[key]
	if set == nil {
		set = &claimSet{key: key}
		t.b.claims[key] = set
	}
	i, found := slices.BinarySearchFunc(set.cs, c, compareClaimants)
	if found {
		return false
	}
	set.cs = slices.Insert(set.cs, i, c)
	o := t.b.svcs[c.svc]
	o.claims = append(o.claims, set)
	return true
}

func (t *builderClaims) remove(key string, c claimant) {
	set := t.b.claims[key]
	if i, found := slices.BinarySearchFunc(set.cs, c, compareClaimants); found {
		set.cs = slices.Delete(set.cs, i, i+1)
	}
	if len(set.cs) == 0 {
		delete(t.b.claims, key)
	}
	// The removes come in the reverse order of the adds: the set is o's last.
	o := t.b.svcs[c.svc]
	o.claims = o.claims[:len(o.claims)-1]
}

// sizer tells when a first build has merged enough Services to guess the final
// size of its large maps, so that they are allocated once rather than grown step
// by step through the whole build.
type sizer struct {
	total, done, at int
}

func newSizer(total int) *sizer {
	return &sizer{total: total, at: max(total/16, 256)}
}

// step counts one more Service merged and reports whether it is time to resize.
func (s *sizer) step() bool {
	s.done++
	return s.done == s.at && s.total >= 4*s.at
}

// estimate returns the size to give a map of n entries, or 0 to leave it alone.
func (s *sizer) estimate(n int) int {
	if n < 64 {
		return 0
	}
	return int(float64(n) * float64(s.total) / float64(s.done) * 1.1)
}

// presized returns a copy of m with room for n entries.
func presized[V any](m map[string]V, n int) map[string]V {
	out := make(map[string]V, n)
	for k, v := range m {
		out[k] = v
	}
	return out
}
