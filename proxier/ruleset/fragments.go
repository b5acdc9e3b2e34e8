package ruleset

import (
	"runtime"
	"slices"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// A first build (Build, or the first Update of a changeset.Builder) builds every Service's
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
// BuildService must therefore stay safe for concurrent use: it reads its
// arguments and writes only the Ruleset it returns.

// Claimant is a Service port claiming a frontend key: Prio 0 for a ClusterIP,
// which wins, 1 for the rest; ties go to the Service, then the port, first in
// name order.
type Claimant struct {
	Prio    int
	ID      string
	Service state.ServiceName
}

// CompareClaimants orders claimants best first.
func CompareClaimants(a, b Claimant) int {
	if a.Prio != b.Prio {
		return a.Prio - b.Prio
	}
	if c := CompareServiceNames(a.Service, b.Service); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// CompareServiceNames orders Service names by namespace, then name.
func CompareServiceNames(a, b state.ServiceName) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// claimRec is one claim made while building a fragment and the answer it got.
type claimRec struct {
	key  string
	c    Claimant
	owns bool
}

// Fragment is one Service's fragment from a first build, with its claims.
type Fragment struct {
	Service *state.Service
	// Objects are the objects the Service contributes, nil when it has no
	// ClusterIP of the family.
	Objects *Ruleset
	claims  []claimRec
	// pre are the Service's ClusterIP claims preClaim registered.
	pre []claimRec
}

// ClaimTable is the registry of claims a first build settles fragments against.
type ClaimTable interface {
	// Best returns the best claimant of key, if any.
	Best(key string) (Claimant, bool)
	// Add registers c on key, reporting whether that changed the table.
	Add(key string, c Claimant) bool
	// Remove undoes Add(key, c) that reported a change; the removes of a fragment
	// come in the reverse order of its adds.
	Remove(key string, c Claimant)
}

// ParallelMin is the number of Services from which a first build uses several
// goroutines; tests lower it so that small clusters take the parallel path too.
var ParallelMin = 512

// fragmentBatch is the number of Services a worker builds at a time.
const fragmentBatch = 64

// BuildFragments builds the fragments of svcs (in Service order) for a first
// build, as this file describes, and hands them to use, in order, on the calling
// goroutine, their claims registered in t. It adds every ClusterIP claim of svcs
// to t first. It returns false, having stopped early, when a fragment breaks the
// assumptions above (its ClusterIP claims are not those registered first): the
// caller must then build sequentially.
func BuildFragments(cfg Config, family knftables.Family, st *state.ClusterState, svcs []*state.Service,
	t ClaimTable, use func(i int, f *Fragment)) bool {
	preLists := make([][]claimRec, len(svcs))
	pre := preClaim(family, svcs, func(i int, key string, c Claimant) {
		preLists[i] = append(preLists[i], claimRec{key: key, c: c})
		t.Add(key, c)
	})
	fb := &fragmentBuild{cfg: cfg, family: family, st: st, svcs: svcs, pre: pre, preLists: preLists, t: t, use: use}
	return fb.run()
}

// fragmentBuild is one run of BuildFragments (or of Build). pre holds the best
// ClusterIP claim of each frontend key and preLists the ClusterIP claims of each
// Service, as preClaim computed them.
type fragmentBuild struct {
	cfg      Config
	family   knftables.Family
	st       *state.ClusterState
	svcs     []*state.Service
	pre      map[string]Claimant
	preLists [][]claimRec
	t        ClaimTable
	use      func(i int, f *Fragment)
}

// build builds fragment i, answering its claims from the ClusterIP claims and its
// own earlier claims only; it is safe for concurrent use.
func (fb *fragmentBuild) build(i int, f *Fragment) {
	svc := fb.svcs[i]
	f.Service, f.pre = svc, fb.preLists[i]
	f.Objects = BuildService(fb.cfg, fb.family, fb.st, svc, func(key []string, id string, prio int) bool {
		k := strings.Join(key, " . ")
		c := Claimant{Prio: prio, ID: id, Service: svc.Name}
		best, ok := fb.pre[k]
		if !ok || CompareClaimants(c, best) < 0 {
			best = c
		}
		for _, r := range f.claims {
			if r.key == k && CompareClaimants(r.c, best) < 0 {
				best = r.c
			}
		}
		owns := best.Service == svc.Name && best.ID == id
		f.claims = append(f.claims, claimRec{key: k, c: c, owns: owns})
		return owns
	})
}

// settle registers the claims of fragment i in the table, building it again when
// one got a wrong answer, and hands it to use. It reports false when the
// fragment's ClusterIP claims are not those registered first.
func (fb *fragmentBuild) settle(i int, f *Fragment) bool {
	if !settleClaims(fb.t, f) {
		// Built with a wrong answer: build it again, answered exactly.
		*f = Fragment{Service: f.Service, pre: f.pre}
		n := f.Service.Name
		f.Objects = BuildService(fb.cfg, fb.family, fb.st, f.Service, func(key []string, id string, prio int) bool {
			k := strings.Join(key, " . ")
			c := Claimant{Prio: prio, ID: id, Service: n}
			fb.t.Add(k, c)
			best, _ := fb.t.Best(k)
			owns := best.Service == n && best.ID == id
			f.claims = append(f.claims, claimRec{key: k, c: c, owns: owns})
			return owns
		})
	}
	if !clusterIPClaimsAsPre(f) {
		return false
	}
	fb.use(i, f)
	return true
}

// run builds and settles every fragment, in parallel when there are enough.
func (fb *fragmentBuild) run() bool {
	workers := runtime.GOMAXPROCS(0)
	if workers < 2 || len(fb.svcs) < ParallelMin {
		for i := range fb.svcs {
			var f Fragment
			fb.build(i, &f)
			if !fb.settle(i, &f) {
				return false
			}
		}
		return true
	}
	return fb.runParallel(workers)
}

// fragmentBatchJob is a batch of fragments a worker builds.
type fragmentBatchJob struct {
	lo    int
	frags []Fragment
	done  chan struct{}
}

// runParallel builds the fragments on workers goroutines and settles them in
// order on the calling one.
func (fb *fragmentBuild) runParallel(workers int) bool {
	svcs := fb.svcs
	jobs := make(chan *fragmentBatchJob, workers)
	// pending bounds how far the workers run ahead of the settling.
	pending := make(chan *fragmentBatchJob, 4*workers)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	go func() {
		defer close(pending)
		defer close(jobs)
		for lo := 0; lo < len(svcs); lo += fragmentBatch {
			bt := &fragmentBatchJob{lo: lo, frags: make([]Fragment, min(fragmentBatch, len(svcs)-lo)), done: make(chan struct{})}
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
						fb.build(bt.lo+j, &bt.frags[j])
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
			if !fb.settle(bt.lo+j, &bt.frags[j]) {
				ok = false
				close(stop)
				break
			}
			bt.frags[j] = Fragment{}
		}
	}
	wg.Wait()
	return ok
}

// settleClaims registers the claims of f in t in the order f made them, and
// reports whether each got the answer the sequential build would have given it
// (the claims of the Services before f's and f's own so far decide). When one did
// not, it withdraws the claims it registered.
func settleClaims(t ClaimTable, f *Fragment) bool {
	n := f.Service.Name
	var added []int
	for i, r := range f.claims {
		if t.Add(r.key, r.c) {
			added = append(added, i)
		}
		best, _ := t.Best(r.key)
		if (best.Service == n && best.ID == r.c.ID) != r.owns {
			for _, j := range slices.Backward(added) {
				t.Remove(f.claims[j].key, f.claims[j].c)
			}
			return false
		}
	}
	return true
}

// clusterIPClaimsAsPre reports whether the ClusterIP claims (priority 0) f made are
// exactly those preClaim registered for its Service.
func clusterIPClaimsAsPre(f *Fragment) bool {
	if f.Objects == nil {
		return len(f.pre) == 0 && len(f.claims) == 0
	}
	same := func(a claimRec) func(claimRec) bool {
		return func(b claimRec) bool { return a.key == b.key && a.c == b.c }
	}
	for _, r := range f.claims {
		if r.c.Prio == 0 && !slices.ContainsFunc(f.pre, same(r)) {
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
// index), as BuildService makes them, and returns the best claimant of each key.
func preClaim(family knftables.Family, svcs []*state.Service, add func(i int, key string, c Claimant)) map[string]Claimant {
	best := map[string]Claimant{}
	for i, svc := range svcs {
		b := &layout{fam: newFamilyInfo(family), claimer: func(key []string, id string, prio int) bool {
			k := strings.Join(key, " . ")
			c := Claimant{Prio: prio, ID: id, Service: svc.Name}
			if cur, ok := best[k]; !ok || CompareClaimants(c, cur) < 0 {
				best[k] = c
			}
			add(i, k, c)
			return false
		}}
		b.claimClusterIPs([]*state.Service{svc})
	}
	return best
}

// SortedServices returns the Services of st in name order.
func SortedServices(st *state.ClusterState) []*state.Service {
	names := make([]state.ServiceName, 0, len(st.Services))
	for n := range st.Services {
		names = append(names, n)
	}
	slices.SortFunc(names, CompareServiceNames)
	svcs := make([]*state.Service, len(names))
	for i, n := range names {
		svcs[i] = st.Services[n]
	}
	return svcs
}
