package changeset

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

// TestBuildOwnerNameCollision: "a/b" + "c" and "a" + "b/c" are both owner
// "a/b/c"; ruleset.Build orders them as the Builder does.
func TestBuildOwnerNameCollision(t *testing.T) {
	st := fixture.NewCluster()
	for _, n := range []state.ServiceName{{Namespace: "a/b", Name: "c"}, {Namespace: "a", Name: "b/c"}} {
		svc := &state.Service{Name: n, Type: "ClusterIP", ClusterIPs: fixture.Addrs("172.30.0.1"), Ports: []state.ServicePort{fixture.TCP("http", 80, 0)}}
		st.Services[n] = svc
		fixture.AddSlice(st, svc, "s", fixture.Targets(svc, 8080), fixture.Endpoint("10.1.0.1", fixture.NodeName))
	}
	cfg := baseConfig()
	cfg.Defaults()
	want, _ := newRefBuilder(cfg, knftables.IPv4Family).Update(st, nil)
	sameRuleset(t, "Build", want, ruleset.Build(st, cfg, knftables.IPv4Family))
	got, _ := NewBuilder(cfg, knftables.IPv4Family).Update(st, nil)
	sameRuleset(t, "Builder", want, got)
}

// TestFirstBuildConflictsAtScale builds clusters where many Services fight over
// the same ExternalIPs and node ports, in parallel, and compares with the
// original Builder.
func TestFirstBuildConflictsAtScale(t *testing.T) {
	cfg := scaleConfig()
	st := fixture.ScaleCluster(2000)
	r := rand.New(rand.NewPCG(3, 4))
	for _, svc := range st.Services {
		if r.IntN(5) == 0 {
			svc.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, byte(r.IntN(4))})}
		}
		if r.IntN(7) == 0 {
			// Another Service's ClusterIP.
			svc.ExternalIPs = append(svc.ExternalIPs, netip.AddrFrom4([4]byte{172, 16, byte(r.IntN(8)), byte(1 + r.IntN(250))}))
		}
		if svc.Ports[0].NodePort != 0 && r.IntN(4) == 0 {
			svc.Ports[0].NodePort = uint16(30000 + r.IntN(16))
		}
	}
	want, wantD, ok := refUpdate(newRefBuilder(cfg, knftables.IPv4Family), st, nil)
	if !ok {
		t.Skip("the original Builder livelocks on this cluster")
	}
	sameRuleset(t, "Build", want, ruleset.Build(st, cfg, knftables.IPv4Family))
	if !NewBuilder(cfg, knftables.IPv4Family).populate(st) {
		t.Fatal("the Builder's first build fell back to a sequential one")
	}
	got, gotD := NewBuilder(cfg, knftables.IPv4Family).Update(st, nil)
	sameRuleset(t, "Builder", want, got)
	if !reflect.DeepEqual(wantD, gotD) {
		t.Error("first Update's Delta differs from the original's")
	}
}
