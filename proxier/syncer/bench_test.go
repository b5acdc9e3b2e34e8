package syncer

import (
	"fmt"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// BenchmarkIncrementalUpdate measures the CPU side of a one-Service update — Builder
// Update plus building the nft transaction — at growing cluster sizes; the time
// must not grow with N.
func BenchmarkIncrementalUpdate(b *testing.B) {
	for _, n := range []int{1000, 10000, 50000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			st := cluster(n)
			bld := changeset.NewBuilder(testConfig, knftables.IPv4Family)
			bld.Update(st, nil)
			f := knftables.NewFake(knftables.IPv4Family, testConfig.Table)
			name := state.ServiceName{Namespace: "ns", Name: "svc-10"}
			ops := 0
			b.ResetTimer()
			for i := range b.N {
				setEndpoints(st, name, 10, 2+i%2)
				rs, d := bld.Update(st, map[state.ServiceName]bool{name: true})
				tx := f.NewTransaction()
				applyDelta(tx, rs, d, nil)
				ops = tx.NumOperations()
			}
			b.ReportMetric(float64(ops), "ops")
		})
	}
}
