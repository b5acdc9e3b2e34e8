package ruleset

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestOwnerList checks the chunked owner list against a sorted slice through
// random inserts, removals and pops, large enough to split chunks.
func TestOwnerList(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	owners := make([]*owner, 3000)
	for i := range owners {
		owners[i] = &owner{name: fmt.Sprintf("ns/svc-%05d", r.IntN(1_000_000))}
	}
	var l ownerList
	var model []string
	in := map[string]bool{}
	check := func(step int) {
		t.Helper()
		var got []string
		for _, c := range l.chunks {
			if len(c) == 0 || len(c) > ownerChunk {
				t.Fatalf("step %d: chunk of %d owners", step, len(c))
			}
			for _, o := range c {
				got = append(got, o.o.name)
			}
		}
		if !slices.Equal(got, model) || l.len() != len(model) {
			t.Fatalf("step %d: list %d owners, model %d", step, len(got), len(model))
		}
	}
	for step := range 20000 {
		o := owners[r.IntN(len(owners))]
		switch op := r.IntN(10); {
		case op < 6 && !in[o.name]:
			// Mostly in order, as a first build adds them.
			if step < 4000 {
				o = &owner{name: fmt.Sprintf("aa/%06d", step)}
			}
			l.insert(owned{o: o, val: o.name})
			in[o.name] = true
			i, _ := slices.BinarySearch(model, o.name)
			model = slices.Insert(model, i, o.name)
		case op < 9:
			l.remove(o.name)
			if in[o.name] {
				delete(in, o.name)
				i, _ := slices.BinarySearch(model, o.name)
				model = slices.Delete(model, i, i+1)
			}
		case len(model) > 0:
			if x := l.popFirst(); x.o.name != model[0] {
				t.Fatalf("step %d: popFirst = %s, want %s", step, x.o.name, model[0])
			}
			delete(in, model[0])
			model = model[1:]
		}
		if p := l.find(o.name); (p != nil) != in[o.name] || (p != nil && p.val != o.name) {
			t.Fatalf("step %d: find(%s) = %v", step, o.name, p)
		}
		if step%97 == 0 {
			check(step)
		}
	}
	check(-1)
}

// TestBuildOwnerNameCollision: "a/b" + "c" and "a" + "b/c" are both owner
// "a/b/c", an order only the Builder's index settles.
func TestBuildOwnerNameCollision(t *testing.T) {
	st := newCluster()
	for _, n := range []state.ServiceName{{Namespace: "a/b", Name: "c"}, {Namespace: "a", Name: "b/c"}} {
		svc := &state.Service{Name: n, Type: "ClusterIP", ClusterIPs: addrs("172.30.0.1"), Ports: []state.ServicePort{tcp("http", 80, 0)}}
		st.Services[n] = svc
		addSlice(st, svc, "s", targets(svc, 8080), ep("10.1.0.1", nodeName))
	}
	cfg := baseConfig()
	cfg.Defaults()
	if buildFresh(st, cfg, knftables.IPv4Family) != nil {
		t.Fatal("buildFresh did not leave the collision to the Builder")
	}
	want, _ := newRefBuilder(cfg, knftables.IPv4Family).Update(st, nil)
	sameRuleset(t, "collision", want, Build(st, cfg, knftables.IPv4Family))
}

// TestFreshBuildStopsOnUnexpectedClusterIPClaims: when a fragment's ClusterIP
// claims are not those registered beforehand, freshBuild stops, sequentially and
// in parallel, without using later fragments.
func TestFreshBuildStopsOnUnexpectedClusterIPClaims(t *testing.T) {
	cfg := baseConfig()
	cfg.Defaults()
	st := scaleCluster(3000)
	svcs := sortedServices(st)
	for _, pmin := range []int{1 << 30, 2} {
		saved := parallelMin
		parallelMin = pmin
		preLists := make([][]claimRec, len(svcs))
		pre := preClaim(knftables.IPv4Family, svcs, func(i int, key string, c claimant) {
			preLists[i] = append(preLists[i], claimRec{key: key, c: c})
		})
		preLists[1000] = preLists[1000][:0] // a claim it will make that was not registered
		tab := &minClaims{pre: pre, over: map[string]claimant{}, undo: map[string]*claimant{}}
		last := -1
		ok := freshBuild(cfg, knftables.IPv4Family, st, svcs, pre, preLists, tab, func(i int, _ *fragment) {
			clear(tab.undo)
			if i != last+1 {
				t.Errorf("fragment %d after %d", i, last)
			}
			last = i
		})
		parallelMin = saved
		if ok || last != 999 {
			t.Errorf("parallelMin %d: freshBuild = %v after fragment %d; want false after 999", pmin, ok, last)
		}
	}
}

// TestFreshBuildConflictsAtScale builds clusters where many Services fight over
// the same ExternalIPs and node ports, in parallel, and compares with the
// original Builder.
func TestFreshBuildConflictsAtScale(t *testing.T) {
	cfg := scaleConfig()
	st := scaleCluster(2000)
	r := rand.New(rand.NewPCG(3, 4))
	for _, svc := range st.Services {
		if r.IntN(5) == 0 {
			svc.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, byte(r.IntN(4))})}
		}
		if r.IntN(7) == 0 {
			// Another Service's ClusterIP.
			svc.ExternalIPs = append(svc.ExternalIPs, netip.AddrFrom4([4]byte{172, 16, byte(r.IntN(8)), byte(1 + r.IntN(250))}))
		}
		if svc.Ports[0].NodePort != 0 && r.IntN(4) == 0 {
			svc.Ports[0].NodePort = uint16(30000 + r.IntN(16))
		}
	}
	want, wantD, ok := refUpdate(newRefBuilder(cfg, knftables.IPv4Family), st, nil)
	if !ok {
		t.Skip("the original Builder livelocks on this cluster")
	}
	fresh := buildFresh(st, cfg, knftables.IPv4Family)
	if fresh == nil {
		t.Fatal("buildFresh fell back to the Builder")
	}
	sameRuleset(t, "Build", want, fresh)
	if !NewBuilder(cfg, knftables.IPv4Family).firstBuild(st) {
		t.Fatal("the Builder's first build fell back to a sequential one")
	}
	got, gotD := NewBuilder(cfg, knftables.IPv4Family).Update(st, nil)
	sameRuleset(t, "Builder", want, got)
	if !reflect.DeepEqual(wantD, gotD) {
		t.Error("first Update's Delta differs from the original's")
	}
}
