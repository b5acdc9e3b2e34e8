package proxier

import (
	"context"
	"fmt"
	"log/slog"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/conntrack"
	"github.com/nftproxy/nftproxy/proxier/health"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// nopCleaner is a ConntrackCleaner that deletes nothing, so that the benchmark
// pays for finding stale entries as the daemon does.
type nopCleaner struct{}

func (nopCleaner) Clear([]conntrack.Filter) (uint, error) { return 0, nil }

// discardNFT is a table that accepts every transaction and keeps nothing: the
// benchmarks measure the proxier, not knftables.Fake (whose element lookups make
// a 10,000-Service first sync take minutes) nor the kernel.
type discardNFT struct{ *knftables.Fake }

func (discardNFT) Run(context.Context, *knftables.Transaction) error { return nil }

// benchProxier returns a Proxier configured as the daemon's (metrics, health
// checks, conntrack cleanup) over Fakes, synced once with n Services of one TCP
// port and 5 endpoints each, as the bench's peer phase creates them.
func benchProxier(b testing.TB, n int) *Proxier {
	b.Helper()
	sh := health.NewServiceHealthServer("127.0.0.1", func() bool { return true }, slog.New(slog.DiscardHandler))
	p, err := New(Config{
		NodeName: "node-a",
		Ruleset: ruleset.Config{Table: testTable, LocalMode: ruleset.LocalClusterCIDR,
			ClusterCIDRs: prefixes("10.0.0.0/8", "fd01::/48"), ServiceCIDRs: prefixes("172.16.0.0/12", "fd02::/112")},
		NewNFT: func(family knftables.Family, table string) (knftables.Interface, error) {
			return discardNFT{knftables.NewFake(family, table)}, nil
		},
		ServiceHealth: sh, Conntrack: nopCleaner{},
	})
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	for i := range n {
		p.OnServiceUpdate(benchService(i))
		p.OnEndpointSliceUpdate(benchSlice(i, 5))
	}
	if err := p.Sync(context.Background()); err != nil {
		b.Fatalf("first sync: %v", err)
	}
	return p
}

func benchService(i int) *v1.Service {
	return service("bench", fmt.Sprintf("svc-%06d", i), fmt.Sprintf("172.16.%d.%d", i/256, i%256), httpPort)
}

func benchSlice(i, eps int) *discoveryv1.EndpointSlice {
	var es []endpoint
	for j := range eps {
		es = append(es, ep(fmt.Sprintf("10.%d.%d.%d", 1+j, i/256, i%256), fmt.Sprintf("node-%d", j)))
	}
	return slice("bench", fmt.Sprintf("svc-%06d", i), fmt.Sprintf("svc-%06d-abc", i), []port{target(httpPort, 8080)}, es...)
}

// BenchmarkEndpointChange measures what the daemon does for one endpoint change
// at n Services: the event handler, then an incremental sync with its metrics,
// health checks and conntrack cleanup. Each iteration removes an endpoint from
// the next Service, or, once every Service has lost one, adds it back, so that
// every sync has a change to apply.
func BenchmarkEndpointChange(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := benchProxier(b, n)
			applied := 0
			p.cfg.OnSynced = func(fam knftables.Family, _ *ruleset.Ruleset, _ syncer.Result) {
				if fam == knftables.IPv4Family {
					applied++
				}
			}
			b.ReportAllocs()
			cpu0 := processCPU(b)
			i := 0
			for b.Loop() {
				p.OnEndpointSliceUpdate(benchSlice(i%n, 4+(i/n)%2))
				if err := p.Sync(context.Background()); err != nil {
					b.Fatalf("sync: %v", err)
				}
				i++
			}
			if applied != i {
				b.Fatalf("%d of %d syncs applied a change", applied, i)
			}
			// The process's CPU time, the garbage collector's included, as the
			// bench's peer phase reports the daemon's.
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU returns the user and system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFullResync measures the periodic full sync (SyncMode with full set) at
// n Services, apart from the endpoint changes: it rewrites every table, so the
// transaction's construction is in it but not the kernel's work.
func BenchmarkFullResync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := benchProxier(b, n)
			b.ReportAllocs()
			cpu0 := processCPU(b)
			for b.Loop() {
				if err := p.SyncMode(context.Background(), true); err != nil {
					b.Fatalf("full sync: %v", err)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
