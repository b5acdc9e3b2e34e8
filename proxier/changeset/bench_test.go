package changeset

import (
	"fmt"
	"net/netip"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

var benchSizes = []int{1000, 10000, 50000}

func scaleConfig() ruleset.Config {
	cfg := ruleset.Config{
		LocalMode:    ruleset.LocalClusterCIDR,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")},
	}
	cfg.Defaults()
	return cfg
}

// BenchmarkBuilderFirstUpdate measures the first Builder.Update (every Service,
// with its Delta), as the proxier's first sync does it.
func BenchmarkBuilderFirstUpdate(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, cfg := fixture.ScaleCluster(n), scaleConfig()
			b.ReportAllocs()
			for b.Loop() {
				NewBuilder(cfg, knftables.IPv4Family).Update(st, nil)
			}
		})
	}
}

// BenchmarkBuilderOneChange measures a Builder.Update of one changed Service.
func BenchmarkBuilderOneChange(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, cfg := fixture.ScaleCluster(n), scaleConfig()
			bld := NewBuilder(cfg, knftables.IPv4Family)
			bld.Update(st, nil)
			name := state.ServiceName{Namespace: "bench-000", Name: "svc-000010"}
			var sl *state.EndpointSlice
			for _, s := range st.Slices[name] {
				sl = s
			}
			full := sl.Endpoints
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				c := *sl
				c.Endpoints = full[:4+i%2]
				st.Slices[name] = map[string]*state.EndpointSlice{c.Name: &c}
				bld.Update(st, map[state.ServiceName]bool{name: true})
				i++
			}
		})
	}
}
