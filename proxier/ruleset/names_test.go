package ruleset

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

func TestPortID(t *testing.T) {
	svc := &state.Service{Name: state.ServiceName{Namespace: "default", Name: "web"}}
	for _, tc := range []struct {
		port state.ServicePort
		want string
	}{
		{state.ServicePort{Name: "http", Protocol: state.TCP, Port: 80}, "default/web/tcp/http"},
		{state.ServicePort{Protocol: state.UDP, Port: 53}, "default/web/udp/53"},
		{state.ServicePort{Name: "m3ua", Protocol: state.SCTP, Port: 2905}, "default/web/sctp/m3ua"},
	} {
		if got := PortID(svc, tc.port); got != tc.want {
			t.Errorf("PortID(%+v) = %q, want %q", tc.port, got, tc.want)
		}
	}
}

func TestElementComment(t *testing.T) {
	if got := elementComment("default/web/tcp/http"); got != "default/web/tcp/http" {
		t.Errorf("elementComment kept %q", got)
	}
	if got := elementComment(strings.Repeat("x", 200)); len(got) != knftables.CommentLengthMax {
		t.Errorf("elementComment of 200 characters has length %d, want %d", len(got), knftables.CommentLengthMax)
	}
}

func TestFamilyPrefixes(t *testing.T) {
	in := fixture.Prefixes("10.1.2.3/8", "10.128.0.0/9", "192.0.2.7/32", "2001:db8::/32", "172.16.0.0/12", "10.0.0.0/8")
	got := newFamilyInfo(knftables.IPv4Family).prefixes(in)
	want := fixture.Prefixes("10.0.0.0/8", "172.16.0.0/12", "192.0.2.7/32")
	if diff := cmp.Diff(want, got, netipComparers); diff != "" {
		t.Errorf("prefixes (-want +got):\n%s", diff)
	}
	if got, want := prefixMatch(got), "{ 10.0.0.0/8, 172.16.0.0/12, 192.0.2.7 }"; got != want {
		t.Errorf("prefixMatch = %q, want %q", got, want)
	}
	if got := newFamilyInfo(knftables.IPv6Family).prefixes(in); len(got) != 1 || got[0].String() != "2001:db8::/32" {
		t.Errorf("ip6 prefixes = %v, want [2001:db8::/32]", got)
	}
}

func TestFamilyAddrs(t *testing.T) {
	in := fixture.Addrs("10.0.0.1", "::ffff:10.0.0.2", "fd00::1", "10.0.0.1", "fe80::1%eth0")
	if got, want := newFamilyInfo(knftables.IPv4Family).addrs(in), fixture.Addrs("10.0.0.1", "10.0.0.2"); !cmp.Equal(got, want, netipComparers) {
		t.Errorf("ip addrs = %v, want %v", got, want)
	}
	if got, want := newFamilyInfo(knftables.IPv6Family).addrs(in), fixture.Addrs("fd00::1", "fe80::1"); !cmp.Equal(got, want, netipComparers) {
		t.Errorf("ip6 addrs = %v, want %v", got, want)
	}
}

func TestAffinityTimeout(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{
		3 * time.Hour:           3 * time.Hour,
		1500 * time.Millisecond: 2 * time.Second,
		time.Nanosecond:         time.Second,
	} {
		if got := affinityTimeout(in); got != want {
			t.Errorf("affinityTimeout(%v) = %v, want %v", in, got, want)
		}
	}
}
