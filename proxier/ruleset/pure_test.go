package ruleset

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

// syntheticCluster returns n Services with unique addresses that cycle through
// every feature (types, traffic policies, affinity, source ranges, dual-stack,
// endpoint counts 0..3 on this node and others, not-ready and terminating ones).
func syntheticCluster(n int) *state.ClusterState {
	st := fixture.NewCluster()
	for i := range n {
		id := fmt.Sprintf("ns%d/svc%d", i%7, i)
		ips := fmt.Sprintf("172.30.%d.%d", i/250, i%250+1)
		if i%3 == 0 {
			ips += fmt.Sprintf(",fd02::%x", i+1)
		}
		ext := fmt.Sprintf("203.0.%d.%d", 113+i/250, i%250+1)
		var opts []fixture.ServiceOption
		switch i % 8 {
		case 1:
			opts = append(opts, fixture.NodePortType)
		case 2:
			opts = append(opts, fixture.LoadBalancer(ext))
		case 3:
			opts = append(opts, fixture.LoadBalancer(ext), fixture.ETPLocal)
		case 4:
			opts = append(opts, fixture.ExternalIPs(ext), fixture.ETPLocal, fixture.Affinity(time.Minute))
		case 5:
			opts = append(opts, fixture.ITPLocal)
		case 6:
			opts = append(opts, fixture.Affinity(3*time.Hour), fixture.NodePortType)
		case 7:
			opts = append(opts, fixture.LoadBalancer(ext), fixture.SourceRanges("192.0.2.0/24", "2001:db8::/32"))
		}
		var nodePort uint16
		if i%8 == 1 || i%8 == 2 || i%8 == 3 || i%8 == 6 || i%8 == 7 {
			nodePort = uint16(30000 + i)
		}
		proto := []func(string, uint16, uint16) state.ServicePort{fixture.TCP, fixture.UDP, fixture.SCTP}[i%3]
		svc := fixture.AddService(st, id, ips, append(opts, fixture.Ports(proto("p", 80, nodePort), fixture.TCP("", 8443, 0)))...)
		var eps []state.SliceEndpoint
		// The count cycles on its own, so that each feature meets every count.
		for j := range (i + i/8) % 4 {
			node := []string{fixture.NodeName, "node-b"}[(i+j)%2]
			var o []fixture.EndpointOption
			switch (i + j) % 5 {
			case 3:
				o = append(o, fixture.NotReady)
			case 4:
				o = append(o, fixture.Terminating(true))
			}
			eps = append(eps, fixture.Endpoint(fmt.Sprintf("10.%d.%d.%d", 1+j, i/250, i%250+1), node, o...))
		}
		fixture.AddSlice(st, svc, "v4", fixture.Targets(svc, 8080), eps...)
		if i%3 == 0 && len(eps) > 0 {
			fixture.AddSlice(st, svc, "v6", fixture.Targets(svc, 8080), fixture.Endpoint(fmt.Sprintf("fd01::%x", i+1), fixture.NodeName))
		}
	}
	return st
}

// everything is a cluster with every feature and the base configuration.
func everything(t testing.TB) (*state.ClusterState, Config) {
	t.Helper()
	cfg := baseConfig()
	cfg.NodePortAddresses = fixture.Prefixes("192.168.0.0/16", "fd00::/8")
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return syntheticCluster(96), cfg
}

// TestBuildDeterministic builds the same input many times: Go randomizes map
// iteration, so any order leaking from the state's maps into rule order, element
// values or the winner of a conflict shows up as a differing dump.
func TestBuildDeterministic(t *testing.T) {
	st, cfg := everything(t)
	build := func(f knftables.Family) *Ruleset { return Build(st, cfg, f) }
	want := dumpRulesets(t, cfg.Table, dual, build)
	for i := range 20 {
		if got := dumpRulesets(t, cfg.Table, dual, build); got != want {
			t.Fatalf("build %d differs from the first (-first +this):\n%s", i+2, cmp.Diff(want, got))
		}
	}
	// A state built again from scratch, with its maps filled in a new order,
	// gives the same ruleset too.
	st2, _ := everything(t)
	if got := dumpRulesets(t, cfg.Table, dual, func(f knftables.Family) *Ruleset { return Build(st2, cfg, f) }); got != want {
		t.Fatalf("an equal state gives a different ruleset (-first +other):\n%s", cmp.Diff(want, got))
	}
}

var netipComparers = cmp.Options{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

// TestBuildPure checks that Build leaves its inputs as they were and keeps no
// reference to them: changing the state afterwards does not change the ruleset.
func TestBuildPure(t *testing.T) {
	st, cfg := everything(t)
	pristine, pristineCfg := everything(t)
	rulesets := BuildAll(st, cfg)
	if diff := cmp.Diff(pristine, st, netipComparers); diff != "" {
		t.Errorf("Build changed the ClusterState (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(pristineCfg, cfg, netipComparers); diff != "" {
		t.Errorf("Build changed the Config (-before +after):\n%s", diff)
	}

	dump := func() string {
		return dumpRulesets(t, cfg.Table, dual, func(f knftables.Family) *Ruleset { return rulesets[f] })
	}
	before := dump()
	for _, svc := range st.Services {
		svc.ClusterIPs[0] = netip.MustParseAddr("172.31.255.255")
		svc.Ports[0].Port = 1
		svc.Name.Name = "changed"
	}
	for _, slices := range st.Slices {
		for _, sl := range slices {
			for i := range sl.Endpoints {
				sl.Endpoints[i].Address = netip.MustParseAddr("10.255.255.255")
			}
		}
	}
	st.Node.Addresses[0] = netip.MustParseAddr("192.168.255.255")
	cfg.ClusterCIDRs[0] = netip.MustParsePrefix("11.0.0.0/8")
	if after := dump(); after != before {
		t.Errorf("changing the inputs after Build changed the ruleset (-before +after):\n%s", cmp.Diff(before, after))
	}
}

// TestBuildAll checks that BuildAll gives each family's Build result.
func TestBuildAll(t *testing.T) {
	st, cfg := everything(t)
	all := BuildAll(st, cfg)
	if len(all) != 2 {
		t.Fatalf("BuildAll returned %d families, want 2", len(all))
	}
	for _, f := range dual {
		want := dumpRulesets(t, cfg.Table, []knftables.Family{f}, func(f knftables.Family) *Ruleset { return Build(st, cfg, f) })
		got := dumpRulesets(t, cfg.Table, []knftables.Family{f}, func(knftables.Family) *Ruleset { return all[f] })
		if got != want {
			t.Errorf("BuildAll[%s] differs from Build (-Build +BuildAll):\n%s", f, cmp.Diff(want, got))
		}
		if all[f].Family != f || all[f].Table != cfg.Table {
			t.Errorf("BuildAll[%s] is for %s %s", f, all[f].Family, all[f].Table)
		}
	}
}

// TestBuildFamilySeparation checks that no address of the other family reaches a
// table, whatever the cluster holds.
func TestBuildFamilySeparation(t *testing.T) {
	st, cfg := everything(t)
	for f, rs := range BuildAll(st, cfg) {
		dump := dumpRulesets(t, cfg.Table, []knftables.Family{f}, func(knftables.Family) *Ruleset { return rs })
		for _, line := range strings.Split(dump, "\n") {
			if !strings.HasPrefix(line, "add element") {
				continue
			}
			_, body, _ := strings.Cut(line, "{")
			for _, word := range strings.Fields(strings.NewReplacer(",", " ", "}", " ", "[", " ", "]", " ").Replace(body)) {
				a, err := netip.ParseAddr(word)
				if err != nil {
					continue
				}
				if a.Is6() != (f == knftables.IPv6Family) {
					t.Errorf("%s table holds %s: %s", f, a, line)
				}
			}
		}
	}
}

// TestDNATChainsOnlyForCountsInUse checks that a dnat-N chain exists exactly when
// some class set with elements sends traffic to it, and that every class set has
// elements and its rule in its dispatch chain.
func TestDNATChainsOnlyForCountsInUse(t *testing.T) {
	st, cfg := everything(t)
	for f, rs := range BuildAll(st, cfg) {
		used := map[string]bool{}
		for set := range rs.Sets {
			c, verdict, ok := ClassOf(set)
			if !ok {
				continue
			}
			if len(rs.Elements[set]) == 0 {
				t.Errorf("%s: class set %s has no element", f, set)
			}
			if !slices.ContainsFunc(rs.Chains[c].Rules, func(r *knftables.Rule) bool { return strings.Contains(r.Rule, "@"+set+" "+verdict) }) {
				t.Errorf("%s: dispatch chain %s has no rule for %s", f, c, set)
			}
			if target, ok := strings.CutPrefix(verdict, "goto "); ok {
				used[target] = true
			}
		}
		for name := range rs.Chains {
			if strings.HasPrefix(name, "dnat-") || strings.HasPrefix(name, "nodeport-dnat-") {
				if !used[name] {
					t.Errorf("%s: chain %s exists but nothing goes to it", f, name)
				}
			}
		}
		for name := range used {
			if rs.Chains[name] == nil {
				t.Errorf("%s: an element goes to missing chain %s", f, name)
			}
		}
	}
}

func TestBuildRejectsInet(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Build(inet) did not panic")
		}
	}()
	Build(fixture.NewCluster(), baseConfig(), knftables.InetFamily)
}

// BenchmarkBuild measures a full Build of the ip table for 10k Services.
func BenchmarkBuild(b *testing.B) {
	st, cfg := syntheticCluster(10000), baseConfig()
	cfg.Defaults()
	for b.Loop() {
		Build(st, cfg, knftables.IPv4Family)
	}
}

// TestHairpinHoldsEveryEndpoint checks that the hairpin set holds the endpoints of
// other nodes too: a pod whose own node does not proxy its Service traffic reaches
// itself through this node, and without masquerading it would answer itself.
func TestHairpinHoldsEveryEndpoint(t *testing.T) {
	st := fixture.NewCluster()
	svc := fixture.AddService(st, "default/web", "172.30.0.10", fixture.Ports(fixture.TCP("http", 80, 0)))
	fixture.AddSlice(st, svc, "web-1", fixture.Targets(svc, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
	rs := Build(st, baseConfig(), knftables.IPv4Family)
	for _, a := range []string{"10.1.0.5", "10.2.0.6"} {
		if _, ok := rs.Elements[SetHairpin][a+" . "+a]; !ok {
			t.Errorf("hairpin set lacks %s . %s", a, a)
		}
	}
}
