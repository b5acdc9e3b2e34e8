package proxier

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// TestStateGaugesFollowChanges checks the state gauges, kept up to date from each
// sync's changed Services, against a count of the whole state after every sync:
// Services and slices added, changed and deleted, a slice before its Service, a
// failed sync, and a change of the Node that makes local endpoints remote.
func TestStateGaugesFollowChanges(t *testing.T) {
	p, fs := newTestProxier(t, nil)
	local := func(name, ip string) *v1.Service {
		svc := service("default", name, ip, httpPort, dnsPort)
		itp := v1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &itp
		return svc
	}
	ports := []port{target(httpPort, 8080), target(dnsPort, 5353)}
	steps := []func(){
		func() {
			p.OnNodeUpdate(node("192.168.0.1"))
			p.OnServiceUpdate(webService())
			p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.1", "node-a"), ep("10.1.0.2", "node-b")))
			p.OnServiceUpdate(local("db", "172.30.0.11"))
			p.OnEndpointSliceUpdate(slice("default", "db", "db-1", ports, ep("10.1.0.3", "node-a")))
		},
		// An endpoint shared by two Services counts once.
		func() { p.OnEndpointSliceUpdate(webSlice(ep("10.1.0.1", "node-a"), ep("10.1.0.3", "node-b"))) },
		func() { p.OnEndpointSliceUpdate(slice("default", "late", "late-1", ports, ep("10.1.0.9", "node-b"))) },
		func() { p.OnServiceUpdate(local("late", "172.30.0.12")) },
		func() {
			p.OnNodeUpdate(&v1.Node{ObjectMeta: node().ObjectMeta, Spec: v1.NodeSpec{PodCIDR: "10.2.0.0/24"}})
		},
		func() {
			fs[knftables.IPv4Family].setFailing(true)
			p.OnServiceDelete(webService())
		},
		func() {
			fs[knftables.IPv4Family].setFailing(false)
			p.OnEndpointSliceDelete(slice("default", "db", "db-1", nil))
		},
	}
	var applied *state.ClusterState // the state of the last successful sync
	for i, step := range steps {
		step()
		err := p.Sync(t.Context())
		if fs[knftables.IPv4Family].failing != (err != nil) {
			t.Fatalf("step %d: sync: %v", i, err)
		}
		if err == nil {
			applied = p.tracker.State() // no event came since the sync
		}
		want := newStateGauges(p.families)
		want.update(nil, applied, nil)
		if !reflect.DeepEqual(p.gauges, want) {
			t.Errorf("step %d: gauges %+v, a recount %+v", i, *p.gauges.families[knftables.IPv4Family], *want.families[knftables.IPv4Family])
		}
	}
	got := p.gauges.families[knftables.IPv4Family]
	// The web Service is gone but its slice (two endpoints) stays, as kube-proxy
	// counts it; db has no endpoints left; late's one endpoint, on two ports, is
	// remote.
	if got.services != 2 || len(got.endpoints) != 4 || got.internal != 2 {
		t.Errorf("final IPv4 gauges: %d Services, %d endpoints, %d ports without local endpoints; want 2, 4, 2",
			got.services, len(got.endpoints), got.internal)
	}
}
