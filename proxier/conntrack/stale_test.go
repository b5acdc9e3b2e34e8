package conntrack

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/proxier/state"
)

var svcName = state.ServiceName{Namespace: "kube-system", Name: "dns"}

// cluster returns a ClusterState with one Service (UDP 53 with node port 30053 and
// TCP 53) at 172.30.0.10 and fd00::10, with the given IPv4 and IPv6 endpoints.
func cluster(eps ...string) *state.ClusterState {
	st := state.NewClusterState()
	st.Node = state.Node{Name: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.2"), netip.MustParseAddr("127.0.0.1")}}
	st.Services[svcName] = &state.Service{
		Name: svcName, Type: "NodePort",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("172.30.0.10"), netip.MustParseAddr("fd00::10")},
		Ports: []state.ServicePort{
			{Name: "dns", Protocol: state.UDP, Port: 53, NodePort: 30053},
			{Name: "dns-tcp", Protocol: state.TCP, Port: 53},
		},
	}
	var v4, v6 []state.SliceEndpoint
	for _, e := range eps {
		a := netip.MustParseAddr(e)
		se := state.SliceEndpoint{Address: a, Ready: true, Serving: true, NodeName: "node-b"}
		if a.Is4() {
			v4 = append(v4, se)
		} else {
			v6 = append(v6, se)
		}
	}
	ports := []state.EndpointPort{{Name: "dns", Protocol: state.UDP, Port: 5353}, {Name: "dns-tcp", Protocol: state.TCP, Port: 5353}}
	st.Slices[svcName] = map[string]*state.EndpointSlice{
		"dns-v4": {Name: "dns-v4", Service: svcName, Ports: ports, Endpoints: v4},
		"dns-v6": {Name: "dns-v6", Service: svcName, IPv6: true, Ports: ports, Endpoints: v6},
	}
	return st
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestStaleWhenAnEndpointGoesAway(t *testing.T) {
	got := Stale(cluster("10.1.0.1", "10.1.0.2", "fd01::1"), cluster("10.1.0.1", "fd01::1"))
	want := []Filter{
		{OrigDst: ap("172.30.0.10:53"), ReplySrc: ap("10.1.0.2:5353")},
		{OrigDst: ap("192.168.1.2:30053"), ReplySrc: ap("10.1.0.2:5353")},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("filters (-want +got):\n%s", diff)
	}
}

func TestStaleWhenAFrontendGainsItsFirstEndpoint(t *testing.T) {
	got := Stale(cluster("fd01::1"), cluster("10.1.0.1", "fd01::1"))
	want := []Filter{
		{OrigDst: ap("172.30.0.10:53"), NotNATed: true},
		{OrigDst: ap("192.168.1.2:30053"), NotNATed: true},
	}
	if !slices.Equal(want, got) {
		t.Errorf("filters = %v, want %v", got, want)
	}
}

func TestStaleWhenTheServiceGoesAway(t *testing.T) {
	empty := state.NewClusterState()
	got := Stale(cluster("fd01::1"), empty)
	want := []Filter{{OrigDst: ap("[fd00::10]:53"), ReplySrc: ap("[fd01::1]:5353")}}
	if !slices.Equal(want, got) {
		t.Errorf("filters = %v, want %v", got, want)
	}
}

func TestStaleNothingWhenNothingChanged(t *testing.T) {
	if got := Stale(cluster("10.1.0.1"), cluster("10.1.0.1")); len(got) != 0 {
		t.Errorf("unchanged cluster gives filters %v", got)
	}
	// Losing every endpoint clears the DNATed flows only; the reject takes over.
	if got := Stale(cluster("10.1.0.1"), cluster()); len(got) != 2 || got[0].NotNATed {
		t.Errorf("losing the last endpoint gives %v, want two DNAT filters", got)
	}
}

func TestStaleFirstSyncClearsOnlyUnNATedFlows(t *testing.T) {
	got := Stale(nil, cluster("10.1.0.1"))
	for _, f := range got {
		if !f.NotNATed || f.ReplySrc.IsValid() {
			t.Errorf("first sync filter %v would delete DNATed flows", f)
		}
	}
	if len(got) != 2 {
		t.Errorf("first sync filters = %v, want the IPv4 ClusterIP and node port", got)
	}
}

func flow(proto uint8, src, dst, replySrc string) *netlink.ConntrackFlow {
	s, d, r := ap(src), ap(dst), ap(replySrc)
	return &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward:    netlink.IPTuple{Protocol: proto, SrcIP: net.IP(s.Addr().AsSlice()), SrcPort: s.Port(), DstIP: net.IP(d.Addr().AsSlice()), DstPort: d.Port()},
		Reverse:    netlink.IPTuple{Protocol: proto, SrcIP: net.IP(r.Addr().AsSlice()), SrcPort: r.Port(), DstIP: net.IP(s.Addr().AsSlice()), DstPort: s.Port()},
	}
}

func TestFilterMatch(t *testing.T) {
	dnat := Filter{OrigDst: ap("172.30.0.10:53"), ReplySrc: ap("10.1.0.2:5353")}
	unNATed := Filter{OrigDst: ap("172.30.0.10:53"), NotNATed: true}
	cases := []struct {
		name   string
		flow   *netlink.ConntrackFlow
		filter Filter
		want   bool
	}{
		{"dnat to the removed endpoint", flow(17, "10.1.0.9:4000", "172.30.0.10:53", "10.1.0.2:5353"), dnat, true},
		{"dnat to another endpoint", flow(17, "10.1.0.9:4000", "172.30.0.10:53", "10.1.0.1:5353"), dnat, false},
		{"same endpoint, other port", flow(17, "10.1.0.9:4000", "172.30.0.10:53", "10.1.0.2:5354"), dnat, false},
		{"tcp flow", flow(6, "10.1.0.9:4000", "172.30.0.10:53", "10.1.0.2:5353"), dnat, false},
		{"other frontend", flow(17, "10.1.0.9:4000", "172.30.0.11:53", "10.1.0.2:5353"), dnat, false},
		{"flow that was never DNATed", flow(17, "10.1.0.9:4000", "172.30.0.10:53", "172.30.0.10:53"), unNATed, true},
		{"DNATed flow vs not-NATed filter", flow(17, "10.1.0.9:4000", "172.30.0.10:53", "10.1.0.1:5353"), unNATed, false},
	}
	for _, c := range cases {
		if got := c.filter.MatchConntrackFlow(c.flow); got != c.want {
			t.Errorf("%s: match = %v, want %v", c.name, got, c.want)
		}
		// The index gives the same answer.
		if got := (index{c.filter.OrigDst: {c.filter}}).MatchConntrackFlow(c.flow); got != c.want {
			t.Errorf("%s: index match = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestCleanerDeletesPerFamily(t *testing.T) {
	table := []*netlink.ConntrackFlow{
		flow(17, "10.1.0.9:4000", "172.30.0.10:53", "10.1.0.2:5353"),
		flow(17, "10.1.0.9:4001", "172.30.0.10:53", "10.1.0.1:5353"),
	}
	var families []netlink.InetFamily
	c := &Cleaner{deleteFilters: func(_ netlink.ConntrackTableType, fam netlink.InetFamily, fs ...netlink.CustomConntrackFilter) (uint, error) {
		families = append(families, fam)
		var n uint
		for _, fl := range table {
			for _, f := range fs {
				if f.MatchConntrackFlow(fl) {
					n++
					break
				}
			}
		}
		return n, nil
	}}
	n, err := c.Clear([]Filter{
		{OrigDst: ap("172.30.0.10:53"), ReplySrc: ap("10.1.0.2:5353")},
		{OrigDst: ap("[fd00::10]:53"), NotNATed: true},
	})
	if err != nil || n != 1 {
		t.Errorf("Clear = %d, %v; want 1 entry deleted", n, err)
	}
	if want := []netlink.InetFamily{unix.AF_INET, unix.AF_INET6}; !slices.Equal(families, want) {
		t.Errorf("families asked = %v, want %v", families, want)
	}
}
