package changeset

import (
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

// TestBuilderServiceCIDRs checks that a change of the ServiceCIDR objects alone,
// which changes no Service, rewrites cluster-ips-check in an incremental Update.
func TestBuilderServiceCIDRs(t *testing.T) {
	cfg := baseConfig()
	st := fixture.NewCluster()
	web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.Ports(fixture.TCP("http", 80, 0)))
	fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName))
	b := NewBuilder(cfg, knftables.IPv4Family)
	b.Update(st, nil)

	next := *st
	next.ServiceCIDRs = fixture.Prefixes("172.31.0.0/16")
	rs, d := b.Update(&next, map[state.ServiceName]bool{})
	if _, ok := d.Chains[ruleset.ChainClusterIPsCheck]; !ok || d.Len() != 1 {
		t.Errorf("delta %s, want only chain %s", deltaSummary(d), ruleset.ChainClusterIPsCheck)
	}
	if diff := Diff(ruleset.Build(&next, cfg, knftables.IPv4Family), rs); diff.Len() != 0 {
		t.Errorf("ruleset differs from ruleset.Build in %s", deltaSummary(diff))
	}
}
