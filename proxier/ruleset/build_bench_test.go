package ruleset

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

func scaleConfig() Config {
	cfg := Config{
		LocalMode:    LocalClusterCIDR,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")},
	}
	cfg.Defaults()
	return cfg
}

var benchSizes = []int{1000, 10000, 50000}

// cpuTime returns the CPU time (user and system, every thread) the process used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU time per op since start as cpu-ns/op, which
// other load on the machine disturbs less than the wall time of ns/op.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkBuildScale measures a from-scratch Build of the ip table at growing
// cluster sizes, 5 endpoints a Service.
func BenchmarkBuildScale(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, cfg := fixture.ScaleCluster(n), scaleConfig()
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				Build(st, cfg, knftables.IPv4Family)
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkAddTo measures queuing a whole ruleset on a transaction, as a full sync
// does.
func BenchmarkAddTo(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			rs := Build(fixture.ScaleCluster(n), scaleConfig(), knftables.IPv4Family)
			f := knftables.NewFake(knftables.IPv4Family, rs.Table)
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				rs.AddTo(f.NewTransaction())
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkBuildServiceOnly measures BuildService alone over every Service, its
// fragments thrown away: the floor of a first build, whatever the merging.
func BenchmarkBuildServiceOnly(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st, cfg := fixture.ScaleCluster(n), scaleConfig()
			b.ReportAllocs()
			for b.Loop() {
				for _, svc := range st.Services {
					BuildService(cfg, knftables.IPv4Family, st, svc, func([]string, string, int) bool { return true })
				}
			}
		})
	}
}
