package syncer

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// BenchmarkKernelNetlinkElement measures one-element netlink batches into a real
// table (root; a namespace of its own): an addition, and a deletion, on the
// transport's kept socket and on a socket opened and closed per batch, as before
// the socket was kept. The deletion on a closed socket waits for the kernel's RCU
// grace period (README, "Scale: tools/bench"); the others do not.
func BenchmarkKernelNetlinkElement(b *testing.B) {
	ctx := context.Background()
	rs := ruleset.Build(cluster(10), testConfig, knftables.IPv4Family)
	ns, nft := kernelNFT(b, "nlbench")
	s := New(nft, WithNetlink(KernelNetlink(ns.Do)))
	if _, err := s.Sync(ctx, rs); err != nil {
		b.Fatal(err)
	}
	c, err := containerOf(rs.Sets[ruleset.SetClusterIPs], nil)
	if err != nil {
		b.Fatal(err)
	}
	next := 0
	// element returns one operation on a cluster-ips element not used before.
	element := func() iter.Seq[*knftables.Element] {
		next++
		e := &knftables.Element{Set: c.name, Key: []string{fmt.Sprintf("10.250.%d.%d", next/250%250, next%250+1)}}
		return maps.Values(map[string]*knftables.Element{"": e})
	}
	for _, socket := range []string{"kept", "per-batch"} {
		for _, op := range []string{"add", "delete"} {
			b.Run(socket+"/"+op, func(b *testing.B) {
				kept := KernelNetlink(ns.Do)
				for range b.N {
					e := element()
					timed := []elementOps{{c: c, add: e, n: 1}}
					if op == "delete" {
						b.StopTimer()
						if err := writeElements(ctx, rs, timed, kept, nil); err != nil {
							b.Fatal(err)
						}
						timed = []elementOps{{c: c, del: e, n: 1}}
						b.StartTimer()
					}
					tr := kept
					if socket == "per-batch" {
						tr = KernelNetlink(ns.Do)
					}
					if err := writeElements(ctx, rs, timed, tr, nil); err != nil {
						b.Fatal(err)
					}
					if socket == "per-batch" {
						if err := tr.(*kernelTransport).Close(); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}
