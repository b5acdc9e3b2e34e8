package changeset

import (
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

// conflictNamespaces sort differently as namespaces ("a" < "a-b") and as the
// "namespace/name" owner names ("a-b/x" < "a/x").
var conflictNamespaces = []string{"a", "a-b", "a.b", "ab", "b"}

// randomService adds (or replaces) Service i with random features drawn from small
// pools of addresses and ports, so that Services fight over frontends, share
// endpoints, chains and elements, and ExternalIPs hit other Services' ClusterIPs.
func randomService(st *state.ClusterState, r *rand.Rand, i int) state.ServiceName {
	id := fmt.Sprintf("%s/svc%d", conflictNamespaces[i%len(conflictNamespaces)], i)
	ips := fmt.Sprintf("172.30.0.%d", 1+r.IntN(12))
	if r.IntN(3) == 0 {
		ips += fmt.Sprintf(",fd02::%x", 1+r.IntN(12))
	}
	var opts []fixture.ServiceOption
	nodePort := func() uint16 { return 0 }
	switch r.IntN(4) {
	case 1:
		opts = append(opts, fixture.NodePortType)
		nodePort = func() uint16 { return uint16(30000 + r.IntN(4)) }
	case 2:
		lb := []string{fmt.Sprintf("203.0.113.%d", 1+r.IntN(4))}
		if r.IntN(3) == 0 {
			lb = append(lb, fmt.Sprintf("2001:db8::%x", 1+r.IntN(4)))
		}
		opts = append(opts, fixture.LoadBalancer(lb...))
		nodePort = func() uint16 { return uint16(30000 + r.IntN(4)) }
		if r.IntN(3) == 0 {
			opts = append(opts, fixture.SourceRanges("192.0.2.0/24", "2001:db8::/32"))
		}
	}
	if r.IntN(4) == 0 {
		// Sometimes another Service's ClusterIP.
		opts = append(opts, fixture.ExternalIPs(fmt.Sprintf("172.30.0.%d", 1+r.IntN(12)), fmt.Sprintf("198.51.100.%d", 1+r.IntN(3))))
	}
	if r.IntN(4) == 0 {
		opts = append(opts, fixture.ETPLocal)
	}
	if r.IntN(6) == 0 {
		opts = append(opts, fixture.ITPLocal)
	}
	if r.IntN(5) == 0 {
		opts = append(opts, fixture.Affinity(time.Duration(1+r.IntN(3))*time.Minute))
	}
	var ps []state.ServicePort
	switch r.IntN(3) {
	case 0:
		ps = append(ps, fixture.TCP("http", 80, nodePort()))
	case 1:
		ps = append(ps, fixture.TCP("", 80, nodePort()), fixture.UDP("dns", 53, nodePort()))
	default:
		ps = append(ps, fixture.TCP("http", uint16(80+r.IntN(2)), nodePort()), fixture.TCP("https", 443, nodePort()))
	}
	svc := fixture.AddService(st, id, ips, append(opts, fixture.Ports(ps...))...)
	delete(st.Slices, svc.Name)
	var eps, eps6 []state.SliceEndpoint
	for range r.IntN(5) {
		node := []string{fixture.NodeName, "node-b", "node-c"}[r.IntN(3)]
		var o []fixture.EndpointOption
		switch r.IntN(6) {
		case 0:
			o = append(o, fixture.NotReady)
		case 1:
			o = append(o, fixture.Terminating(r.IntN(2) == 0))
		}
		eps = append(eps, fixture.Endpoint(fmt.Sprintf("10.1.0.%d", 1+r.IntN(8)), node, o...))
		if r.IntN(3) == 0 {
			eps6 = append(eps6, fixture.Endpoint(fmt.Sprintf("fd01::%x", 1+r.IntN(8)), node, o...))
		}
	}
	fixture.AddSlice(st, svc, "v4", fixture.Targets(svc, uint16(8080+r.IntN(2))), eps...)
	if len(eps6) > 0 {
		fixture.AddSlice(st, svc, "v6", fixture.Targets(svc, 8080), eps6...)
	}
	return svc.Name
}

// randomCluster returns a generator seeded by seed and salt and a cluster of 16
// random Services drawn from it.
func randomCluster(seed, salt uint64) (*rand.Rand, *state.ClusterState) {
	r := rand.New(rand.NewPCG(seed, salt))
	st := fixture.NewCluster()
	for i := range 16 {
		randomService(st, r, i)
	}
	return r, st
}

// randomChange changes or deletes one of 24 Services at random and returns its name.
func randomChange(st *state.ClusterState, r *rand.Rand) state.ServiceName {
	i := r.IntN(24)
	name := state.ServiceName{Namespace: conflictNamespaces[i%len(conflictNamespaces)], Name: fmt.Sprintf("svc%d", i)}
	if r.IntN(4) == 0 {
		delete(st.Services, name)
		delete(st.Slices, name)
	} else {
		randomService(st, r, i)
	}
	return name
}

func sameRuleset(t *testing.T, what string, want, got *ruleset.Ruleset) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("%s: ruleset differs from the original Builder's in %d objects", what, Diff(want, got).Len())
	}
}

func sameDelta(t *testing.T, what string, want, got *Delta) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("%s: delta differs from the original Builder's:\nwant %s\ngot  %s", what, deltaSummary(want), deltaSummary(got))
	}
}

func deltaSummary(d *Delta) string {
	var parts []string
	for n, c := range d.Chains {
		parts = append(parts, fmt.Sprintf("chain %s %v/%v", n, c.Old != nil, c.New != nil))
	}
	for n, c := range d.Sets {
		parts = append(parts, fmt.Sprintf("set %s %v/%v", n, c.Old != nil, c.New != nil))
	}
	for n, c := range d.Maps {
		parts = append(parts, fmt.Sprintf("map %s %v/%v", n, c.Old != nil, c.New != nil))
	}
	for cont, es := range d.Elements {
		for k, c := range es {
			parts = append(parts, fmt.Sprintf("element %s[%s] %v/%v", cont, k, c.Old != nil, c.New != nil))
		}
	}
	return strings.Join(parts, "; ")
}

// TestBuilderMatchesOriginal drives the Builder and the original one (kept in
// refbuilder_test.go) through the same random churn and requires identical
// rulesets and Deltas at every step, and ruleset.Build to match the Builder.
func TestBuilderMatchesOriginal(t *testing.T) {
	cfg := baseConfig()
	cfg.Defaults()
	compared, livelocks := 0, 0
	for seed := range uint64(60) {
		r := rand.New(rand.NewPCG(seed, 11))
		st := fixture.NewCluster()
		for i := range 20 {
			if r.IntN(4) > 0 {
				randomService(st, r, i)
			}
		}
		for _, fam := range dual {
			what := fmt.Sprintf("seed %d %s", seed, fam)
			b := NewBuilder(cfg, fam)
			gotRS, gotD := b.Update(st, nil)
			sameRuleset(t, what+" ruleset.Build", gotRS, ruleset.Build(st, cfg, fam))
			wantRS, wantD, ok := refUpdate(newRefBuilder(cfg, fam), st, nil)
			if !ok {
				livelocks++
				continue
			}
			compared++
			sameRuleset(t, what, wantRS, gotRS)
			sameDelta(t, what, wantD, gotD)
		}
	}
	t.Logf("%d states compared with the original Builder; %d would livelock it", compared, livelocks)
	if compared < livelocks {
		t.Errorf("too few states compared")
	}
}

// refUpdate runs ref.Update, reporting false when the original would livelock.
func refUpdate(ref *refBuilder, st *state.ClusterState, changed map[state.ServiceName]bool) (rs *ruleset.Ruleset, d *Delta, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if r != errRefLivelock {
				panic(r)
			}
			ok = false
		}
	}()
	rs, d = ref.Update(st, changed)
	return rs, d, true
}

// TestBuilderChurnMatchesOriginal applies random changes through Update with the
// changed Services named (and sometimes with nil, everything), comparing with the
// original Builder at each step.
func TestBuilderChurnMatchesOriginal(t *testing.T) {
	cfg := baseConfig()
	cfg.Defaults()
	compared, livelocks := 0, 0
	for seed := range uint64(40) {
		r, st := randomCluster(seed, 13)
		fam := dual[seed%2]
		ref, b := newRefBuilder(cfg, fam), NewBuilder(cfg, fam)
		gotRS, gotD := b.Update(st, nil)
		wantRS, wantD, ok := refUpdate(ref, st, nil)
		if ok {
			sameRuleset(t, fmt.Sprintf("seed %d first", seed), wantRS, gotRS)
			sameDelta(t, fmt.Sprintf("seed %d first", seed), wantD, gotD)
		}
		for step := range 60 {
			changed := map[state.ServiceName]bool{}
			for range 1 + r.IntN(3) {
				changed[randomChange(st, r)] = true
			}
			if r.IntN(10) == 0 {
				st.Node.Addresses = fixture.Addrs(fmt.Sprintf("192.168.0.%d", 10+r.IntN(3)), "fd00:192:168::10")
			}
			if r.IntN(8) == 0 {
				changed = nil
			}
			what := fmt.Sprintf("seed %d step %d", seed, step)
			gotRS, gotD := b.Update(st, changed)
			sameRuleset(t, what+" ruleset.Build", gotRS, ruleset.Build(st, cfg, fam))
			if !ok {
				// The original livelocked earlier: restart it from this state.
				ref = newRefBuilder(cfg, fam)
				_, _, ok = refUpdate(ref, st, nil)
				continue
			}
			wantRS, wantD, ok2 := refUpdate(ref, st, changed)
			if !ok2 {
				livelocks++
				ok = false
				continue
			}
			compared++
			sameRuleset(t, what, wantRS, gotRS)
			sameDelta(t, what, wantD, gotD)
		}
	}
	t.Logf("%d steps compared with the original Builder; %d would livelock it", compared, livelocks)
	if compared < livelocks {
		t.Errorf("too few steps compared")
	}
}

// TestMain runs the tests with parallel first builds from a few Services on, so
// that the small clusters of the tests take the parallel path too.
func TestMain(m *testing.M) {
	ruleset.ParallelMin = 2
	os.Exit(m.Run())
}

// TestMutualConflictTerminates: each Service's ExternalIP is the other's ClusterIP.
// The original Builder rebuilt them in turn forever, each rebuild withdrawing and
// renewing its claims and so marking the other Service dirty.
func TestMutualConflictTerminates(t *testing.T) {
	st := fixture.NewCluster()
	a := fixture.AddService(st, "default/a", "172.30.0.1", fixture.ExternalIPs("172.30.0.2"), fixture.Ports(fixture.TCP("http", 80, 0)))
	fixture.AddSlice(st, a, "a", fixture.Targets(a, 8080), fixture.Endpoint("10.1.0.1", fixture.NodeName))
	bb := fixture.AddService(st, "default/b", "172.30.0.2", fixture.ExternalIPs("172.30.0.1"), fixture.Ports(fixture.TCP("http", 80, 0)))
	fixture.AddSlice(st, bb, "b", fixture.Targets(bb, 8080), fixture.Endpoint("10.1.0.2", fixture.NodeName))
	cfg := baseConfig()
	cfg.Defaults()
	done := make(chan bool)
	go func() {
		b := NewBuilder(cfg, knftables.IPv4Family)
		b.Update(st, nil)
		done <- true
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Builder.Update does not terminate")
	}
}
