package ruleset

import (
	"fmt"
	"reflect"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

// TestFragmentBuildStopsOnUnexpectedClusterIPClaims: when a fragment's ClusterIP
// claims are not those registered beforehand, the fragment build stops, sequentially and
// in parallel, without using later fragments.
func TestFragmentBuildStopsOnUnexpectedClusterIPClaims(t *testing.T) {
	cfg := baseConfig()
	cfg.Defaults()
	st := fixture.ScaleCluster(3000)
	svcs := SortedServices(st)
	for _, pmin := range []int{1 << 30, 2} {
		saved := ParallelMin
		ParallelMin = pmin
		preLists := make([][]claimRec, len(svcs))
		pre := preClaim(knftables.IPv4Family, svcs, func(i int, key string, c Claimant) {
			preLists[i] = append(preLists[i], claimRec{key: key, c: c})
		})
		preLists[1000] = preLists[1000][:0] // a claim it will make that was not registered
		tab := &minClaims{pre: pre, over: map[string]Claimant{}, undo: map[string]*Claimant{}}
		last := -1
		fb := &fragmentBuild{cfg: cfg, family: knftables.IPv4Family, st: st, svcs: svcs, pre: pre, preLists: preLists, t: tab}
		fb.use = func(i int, _ *Fragment) {
			clear(tab.undo)
			if i != last+1 {
				t.Errorf("fragment %d after %d", i, last)
			}
			last = i
		}
		ok := fb.run()
		ParallelMin = saved
		if ok || last != 999 {
			t.Errorf("ParallelMin %d: run = %v after fragment %d; want false after 999", pmin, ok, last)
		}
	}
}

// TestLastOfEach checks that LastOfEach keeps the last element of each set or map
// and key, as adding them to Elements one by one does, on short lists (scanned)
// and long ones (mapped).
func TestLastOfEach(t *testing.T) {
	for _, n := range []int{0, 1, 5, lastOfEachScan, lastOfEachScan + 1, 300} {
		var list []Listed
		want := New(knftables.IPv4Family, "t")
		for i := range n {
			x := Listed{Cont: fmt.Sprint("c", i%3), Key: fmt.Sprint(i % 7), Elem: Elem{Data: fmt.Sprint(i)}}
			list = append(list, x)
			want.AddElement(x.Cont, x.Key, x.Elem)
		}
		got := New(knftables.IPv4Family, "t")
		out := LastOfEach(list)
		for _, x := range out {
			if _, ok := got.Elements[x.Cont][x.Key]; ok {
				t.Fatalf("n=%d: %s %s listed twice", n, x.Cont, x.Key)
			}
			got.AddElement(x.Cont, x.Key, x.Elem)
		}
		if !reflect.DeepEqual(want.Elements, got.Elements) {
			t.Errorf("n=%d: LastOfEach kept %v, want %v", n, got.Elements, want.Elements)
		}
	}
}
