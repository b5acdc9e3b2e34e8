package proxier

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/conntrack"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// randomEvent sends p one random event: a Service (UDP and TCP ports, a ClusterIP
// and external IP from small pools so that Services share frontends) or its slice
// updated or deleted, or the Node's addresses changed.
func randomEvent(p *Proxier, rng *rand.Rand) {
	name := fmt.Sprint("svc-", rng.IntN(8))
	ports := []port{target(dnsPort, 5353), target(httpPort, 8080)}
	switch rng.IntN(8) {
	case 0, 1:
		svc := service("default", name, fmt.Sprint("172.30.0.", 10+rng.IntN(3)), dnsPort, httpPort)
		if rng.IntN(2) == 0 {
			svc.Spec.ExternalIPs = []string{fmt.Sprint("203.0.113.", 1+rng.IntN(2))}
		}
		if rng.IntN(3) == 0 {
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}
		p.OnServiceUpdate(svc)
	case 2:
		p.OnServiceDelete(service("default", name, ""))
	case 3, 4, 5:
		var eps []endpoint
		for i := range rng.IntN(4) {
			eps = append(eps, ep(fmt.Sprint("10.1.0.", 1+i+rng.IntN(3)), []string{"node-a", "node-b"}[rng.IntN(2)]))
		}
		p.OnEndpointSliceUpdate(slice("default", name, name+"-1", ports, eps...))
	case 6:
		p.OnEndpointSliceDelete(slice("default", name, name+"-1", nil))
	default:
		p.OnNodeUpdate(node(fmt.Sprint("192.168.0.", 1+rng.IntN(2))))
	}
}

// TestAfterSyncFollowsChangesAsAFullComputation sends random events, with syncs
// that now and then fail, and checks after every successful sync that the stale
// conntrack filters, found from the changed Services alone, are those of a diff of
// the whole states the last two successful syncs applied, and that the state
// gauges equal a recount.
func TestAfterSyncFollowsChangesAsAFullComputation(t *testing.T) {
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 3))
		rec := &recordingCleaner{}
		p, fs := newTestProxier(t, func(c *Config) { c.Conntrack = rec })
		var applied *state.ClusterState // what the last successful sync applied
		for step := range 150 {
			for range 1 + rng.IntN(3) {
				randomEvent(p, rng)
			}
			fs[knftables.IPv4Family].setFailing(rng.IntN(6) == 0)
			rec.filters = nil
			if err := p.Sync(t.Context()); err != nil {
				continue
			}
			cur := p.tracker.State() // no event came since the sync
			want := conntrack.Stale(applied, cur)
			got := slices.Concat(rec.filters...)
			slices.SortFunc(got, func(a, b conntrack.Filter) int { return slices.Index(want, a) - slices.Index(want, b) })
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: filters %v, want %v", seed, step, got, want)
			}
			recount := newStateGauges(p.families)
			recount.update(nil, cur, nil)
			if !reflect.DeepEqual(p.gauges, recount) {
				t.Fatalf("seed %d step %d: gauges %+v, a recount %+v", seed, step,
					*p.gauges.families[knftables.IPv4Family], *recount.families[knftables.IPv4Family])
			}
			applied = cur
		}
	}
}
