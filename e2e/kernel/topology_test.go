package kernel

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/packet"
)

// parse parses an inline scenario.
func parse(t *testing.T, text string) *features.Scenario {
	t.Helper()
	sc, err := features.Parse([]byte(text), "inline.yaml")
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return sc
}

func derive(t *testing.T, text string) *Topology {
	t.Helper()
	topo, err := Derive(parse(t, text))
	if err != nil {
		t.Fatalf("Derive: %v", err)
	}
	return topo
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

var cmpAddrs = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })
var cmpPrefixes = cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })

// webScenario has a local and a remote endpoint, a second port and a third endpoint that
// only a later update adds, and packets from every origin.
const webScenario = `
feature: test
pins: the topology of a small cluster
node:
  name: node-a
  addresses: [192.168.0.10, 192.168.1.10]
  podCIDRs: [10.1.0.0/16]
config:
  clusterCIDR: 10.0.0.0/8,fd00::/28
  serviceCIDR: 172.30.0.0/16,fd00:30::/108
cluster: |
  apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: shop}
  spec:
    type: LoadBalancer
    clusterIP: 172.30.0.10
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
  status:
    loadBalancer:
      ingress: [{ip: 198.51.100.10}]
  ---
  apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-x1
    namespace: shop
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - addresses: [10.1.0.20]
    nodeName: node-a
  - addresses: [10.2.0.21]
    nodeName: node-b
steps:
- packet: tcp 10.1.0.5:40000 -> 172.30.0.10:80
  expect: {endpoints: [10.1.0.20:8080, 10.2.0.21:8080]}
- update: |
    apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata:
      name: web-x2
      namespace: shop
      labels: {kubernetes.io/service-name: web}
    addressType: IPv4
    ports: [{name: http, port: 9090, protocol: TCP}]
    endpoints:
    - addresses: [10.1.0.20]
      nodeName: node-a
    - addresses: [10.3.0.22]
      nodeName: node-c
- packet: tcp 10.2.0.7:40001 -> 172.30.0.10:80
  expect: {endpoints: [10.1.0.20:8080, 10.2.0.21:8080]}
- packet: tcp 203.0.113.7:40002 -> 198.51.100.10:80
  expect: {endpoints: [10.1.0.20:8080, 10.2.0.21:8080]}
- packet: tcp 192.168.0.10:40003 -> 192.168.1.10:30080
  expect: {endpoints: [10.1.0.20:8080, 10.2.0.21:8080]}
- packet: udp 203.0.113.7:40004 -> 192.168.0.10:22
  expect: {verdict: local}
- packet: tcp 203.0.113.7:40005 -> 192.168.0.99:80
  expect: {verdict: unhandled}
`

func TestDeriveWholeScenario(t *testing.T) {
	topo := derive(t, webScenario)
	want := lab.Spec{
		// 192.168.0.99, a destination nobody has, must not be on the node's link.
		NodeAddrs: prefixes("192.168.0.10/26", "192.168.1.10/24", "203.0.113.254/24"),
		Pods: []lab.PodSpec{
			{Name: "10.1.0.20", Addrs: addrs("10.1.0.20"), Ports: []uint16{8080, 9090}},
			{Name: "10.1.0.5", Addrs: addrs("10.1.0.5")},
		},
		Remote: &lab.RemoteSpec{
			NodeAddrs: prefixes("192.168.0.10/30"),
			Addrs:     prefixes("192.168.0.9/30"),
			PodCIDRs:  prefixes("10.2.0.21/32", "10.3.0.22/32", "10.2.0.7/32"),
			Pods: []lab.PodSpec{
				{Name: "10.2.0.21", Addrs: addrs("10.2.0.21"), Ports: []uint16{8080}},
				{Name: "10.3.0.22", Addrs: addrs("10.3.0.22"), Ports: []uint16{9090}},
				{Name: "10.2.0.7", Addrs: addrs("10.2.0.7")},
			},
		},
		Client: &lab.ClientSpec{Addrs: prefixes("203.0.113.7/24", "192.168.0.62/26")},
	}
	if diff := cmp.Diff(want, topo.Spec, cmpAddrs, cmpPrefixes); diff != "" {
		t.Errorf("Spec (-want +got):\n%s", diff)
	}
	wantPlaces := map[netip.Addr]Place{
		netip.MustParseAddr("192.168.0.10"): {Origin: features.FromNode},
		netip.MustParseAddr("192.168.1.10"): {Origin: features.FromNode},
		netip.MustParseAddr("127.0.0.1"):    {Origin: features.FromNode},
		netip.MustParseAddr("::1"):          {Origin: features.FromNode},
		netip.MustParseAddr("10.1.0.20"):    {Origin: features.FromPod, Pod: "10.1.0.20"},
		netip.MustParseAddr("10.1.0.5"):     {Origin: features.FromPod, Pod: "10.1.0.5"},
		netip.MustParseAddr("10.2.0.21"):    {Origin: features.FromRemotePod, Pod: "10.2.0.21"},
		netip.MustParseAddr("10.3.0.22"):    {Origin: features.FromRemotePod, Pod: "10.3.0.22"},
		netip.MustParseAddr("10.2.0.7"):     {Origin: features.FromRemotePod, Pod: "10.2.0.7"},
		netip.MustParseAddr("203.0.113.7"):  {Origin: features.FromExternal},
	}
	if diff := cmp.Diff(wantPlaces, topo.Places, cmpAddrs); diff != "" {
		t.Errorf("Places (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(addrs("10.2.0.7"), topo.RemoteSources, cmpAddrs); diff != "" {
		t.Errorf("RemoteSources (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Port{{Proto: lab.UDP, Port: 22}}, topo.LocalPorts); diff != "" {
		t.Errorf("LocalPorts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(addrs("192.168.0.10", "192.168.1.10", "127.0.0.1", "::1"), topo.LocalAddrs, cmpAddrs); diff != "" {
		t.Errorf("LocalAddrs (-want +got):\n%s", diff)
	}
	if len(topo.Unsupported) != 0 {
		t.Errorf("Unsupported = %v, want none", topo.Unsupported)
	}
}

// dualStackScenario has an IPv6 external client and remote endpoint, and an IPv6 pod in
// a scenario whose node has an IPv4 address only for the second test.
const dualStackScenario = `
feature: test
pins: the topology of a dual-stack cluster
node:
  addresses: [192.168.0.10, fd00:168::10]
  podCIDRs: [10.1.0.0/16, "fd00:1::/64"]
config:
  detectLocal: {interfaceNamePrefix: cali}
  detectLocalMode: InterfaceNamePrefix
  serviceCIDR: 172.30.0.0/16,fd00:30::/108
cluster: |
  apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: shop}
  spec:
    ipFamilies: [IPv6]
    clusterIP: fd00:30::10
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
  ---
  apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-x1
    namespace: shop
    labels: {kubernetes.io/service-name: web}
  addressType: IPv6
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - addresses: ["fd00:2::21"]
    nodeName: node-b
steps:
- packet: tcp [2001:db8::7]:40000 -> [fd00:30::10]:80
  expect: {endpoints: ["[fd00:2::21]:8080"]}
- packet: tcp [fd00:1::5]:40001 -> [fd00:30::10]:80
  expect: {endpoints: ["[fd00:2::21]:8080"]}
`

func TestDeriveDualStack(t *testing.T) {
	topo := derive(t, dualStackScenario)
	want := lab.Spec{
		NodeAddrs:  prefixes("192.168.0.10/24", "fd00:168::10/64", "2001:db8::ffff:ffff:ffff:fffe/64"),
		VethPrefix: "cali",
		Pods:       []lab.PodSpec{{Name: "fd00x1xx5", Addrs: addrs("fd00:1::5")}},
		Remote: &lab.RemoteSpec{
			// ::10 is the network address of every subnet narrower than /123.
			NodeAddrs: prefixes("192.168.0.10/30", "fd00:168::10/123"),
			Addrs:     prefixes("192.168.0.9/30", "fd00:168::1e/123"),
			PodCIDRs:  prefixes("fd00:2::21/128"),
			Pods:      []lab.PodSpec{{Name: "fd00x2xx21", Addrs: addrs("fd00:2::21"), Ports: []uint16{8080}}},
		},
		// An address in each of the node's first subnets carries the default routes.
		Client: &lab.ClientSpec{Addrs: prefixes("2001:db8::7/64", "192.168.0.254/24", "fd00:168::ffff:ffff:ffff:fffe/64")},
	}
	if diff := cmp.Diff(want, topo.Spec, cmpAddrs, cmpPrefixes); diff != "" {
		t.Errorf("Spec (-want +got):\n%s", diff)
	}

	v4only := strings.Replace(dualStackScenario, "[192.168.0.10, fd00:168::10]", "[192.168.0.10]", 1)
	topo = derive(t, v4only)
	for _, a := range addrs("fd00:2::21", "2001:db8::7", "fd00:1::5") {
		if why := topo.Unsupported[a]; !strings.Contains(why, "no IPv6 address") {
			t.Errorf("Unsupported[%s] = %q, want a reason naming the missing IPv6 node address", a, why)
		}
	}
	if topo.Spec.Remote != nil || topo.Spec.Client != nil || len(topo.Spec.Pods) != 0 {
		t.Errorf("IPv4-only node: got pods %v, remote %v, client %v; want none", topo.Spec.Pods, topo.Spec.Remote, topo.Spec.Client)
	}
}

func TestDeriveRejectsInterfacePrefixOfLabLinks(t *testing.T) {
	sc := parse(t, strings.Replace(dualStackScenario, "interfaceNamePrefix: cali", "interfaceNamePrefix: eth", 1))
	_, err := Derive(sc)
	if err == nil || !strings.Contains(err.Error(), `detectLocal.interfaceNamePrefix "eth"`) {
		t.Fatalf("Derive = %v, want an error naming the prefix", err)
	}
}

// TestDeriveClientSubnetAvoidsOtherAddresses: a client whose /24 holds a VIP and another
// client gets a narrower subnet of its own, so that the VIP stays routed through the node.
func TestDeriveClientSubnetAvoidsOtherAddresses(t *testing.T) {
	text := strings.NewReplacer(
		"198.51.100.10", "203.0.113.200",
		"tcp 203.0.113.7:40002 -> 198.51.100.10:80", "tcp 203.0.113.7:40002 -> 203.0.113.200:80",
	).Replace(webScenario)
	topo := derive(t, text)
	vip := netip.MustParseAddr("203.0.113.200")
	for _, p := range append(append([]netip.Prefix{}, topo.Spec.NodeAddrs...), topo.Spec.Client.Addrs...) {
		if p.Masked().Contains(vip) {
			t.Errorf("subnet %s holds the LB IP %s", p, vip)
		}
	}
	if _, ok := within(topo.Spec.Client.Addrs, netip.MustParseAddr("203.0.113.7")); !ok {
		t.Errorf("client addresses %v lack 203.0.113.7", topo.Spec.Client.Addrs)
	}
}

func TestLocate(t *testing.T) {
	topo := derive(t, dualStackScenario)
	pod := Place{Origin: features.FromPod, Pod: "fd00x1xx5"}
	for _, c := range []struct {
		pkt     string
		from    features.Origin
		exp     features.Expect
		want    Place
		problem string // in the error, which wraps ErrUnsupported; empty: supported
	}{
		{pkt: "tcp [fd00:1::5]:1 -> [fd00:30::10]:80", from: features.FromPod, want: pod},
		{pkt: "tcp [fd00:1::5]:1 -> [fd00:30::10]:80 iif cali7", from: features.FromPod, want: pod},
		{pkt: "tcp [2001:db8::7]:1 -> [fd00:30::10]:80 iif eth0", from: features.FromExternal, want: Place{Origin: features.FromExternal}},
		{pkt: "tcp [fd00:168::10]:1 -> [fd00:30::10]:80", from: features.FromNode, want: Place{Origin: features.FromNode}},
		{pkt: "tcp [::1]:1 -> [::1]:80", from: features.FromNode, exp: features.Expect{Local: true}, want: Place{Origin: features.FromNode}},
		{pkt: "tcp [2001:db8::7]:1 -> [fd00:30::10]:80 iif veth0", from: features.FromExternal, exp: features.Expect{Unhandled: true}, want: Place{Origin: features.FromExternal}, problem: "iif veth0"},
		{pkt: "tcp [fd00:1::5]:1 -> [fd00:30::10]:80 iif veth0", from: features.FromPod, problem: "arrive on the pod's interface caliN"},
		{pkt: "tcp [fd00:1::5]:1 -> [fd00:30::10]:80", from: features.FromRemotePod, problem: "is pod fd00x1xx5 of the node"},
		{pkt: "tcp [fd00:99::1]:1 -> [fd00:30::10]:80", from: features.FromNode, problem: "not an address of the node"},
		{pkt: "tcp [fd00:1::5]:1 -> [fd00:30::10]:80 ct established", from: features.FromPod, problem: "conntrack state established"},
		{pkt: "tcp [fd00:1::5]:1 -> [fd00:30::10]:80 mark 0x4000", from: features.FromPod, problem: "mark 0x4000"},
		{pkt: "sctp [fd00:1::5]:1 -> [fd00:168::10]:80", from: features.FromPod, exp: features.Expect{Local: true}, problem: "TCP and UDP only"},
		{pkt: "icmpv6 fd00:1::5 -> fd00:30::10", from: features.FromPod, problem: "protocol icmpv6"},
	} {
		p, err := packet.Parse(c.pkt)
		if err != nil {
			t.Fatalf("packet %q: %v", c.pkt, err)
		}
		got, err := topo.Locate(p, c.from, &c.exp)
		switch {
		case c.problem == "" && err != nil:
			t.Errorf("Locate(%s from %s) = %v, want %v", c.pkt, c.from, err, c.want)
		case c.problem == "" && got != c.want:
			t.Errorf("Locate(%s from %s) = %v, want %v", c.pkt, c.from, got, c.want)
		case c.problem != "" && (err == nil || !errors.Is(err, features.ErrUnsupported) || !strings.Contains(err.Error(), c.problem)):
			t.Errorf("Locate(%s from %s) = %v, %v; want an ErrUnsupported saying %q", c.pkt, c.from, got, err, c.problem)
		}
	}
}

// TestDeriveEveryScenario derives the lab of every feature scenario and checks what
// lab.New will check, and what the Backend relies on: the node's addresses come first,
// every client and remote address shares a subnet with the node, and no link's subnet
// holds an address that lives elsewhere.
func TestDeriveEveryScenario(t *testing.T) {
	scs, err := features.LoadDir("../../features")
	if err != nil {
		t.Fatal(err)
	}
	if len(scs) == 0 {
		t.Fatal("no scenarios under features/")
	}
	for _, sc := range scs {
		topo, err := Derive(sc)
		if err != nil {
			t.Errorf("%s: %v", sc.File, err)
			continue
		}
		s := topo.Spec
		if got := hostsOf(s.NodeAddrs[:len(sc.Node.Addresses)]); !cmp.Equal(got, sc.Node.Addresses, cmpAddrs) {
			t.Errorf("%s: node eth0 starts with %v, want the node's addresses %v", sc.File, got, sc.Node.Addresses)
		}
		links := map[string][]netip.Prefix{"node eth0": s.NodeAddrs}
		if s.Client != nil {
			links["client"] = s.Client.Addrs
			for _, a := range s.Client.Addrs {
				if !sameSubnetAs(a, s.NodeAddrs) {
					t.Errorf("%s: client address %s is in no subnet of the node's eth0 %v", sc.File, a, s.NodeAddrs)
				}
			}
		}
		if r := s.Remote; r != nil {
			links["node eth1"] = r.NodeAddrs
			for _, a := range r.Addrs {
				if !sameSubnetAs(a, r.NodeAddrs) {
					t.Errorf("%s: remote address %s is in no subnet of the node's eth1 %v", sc.File, a, r.NodeAddrs)
				}
			}
			for _, p := range r.Pods {
				if !containedIn(r.PodCIDRs, p.Addrs[0]) {
					t.Errorf("%s: remote pod %s is outside the remote pod CIDRs", sc.File, p.Name)
				}
			}
		}
		for a, pl := range topo.Places {
			for link, ps := range links {
				if pl.Origin == features.FromNode || (pl.Origin == features.FromExternal && link != "node eth1") {
					continue
				}
				for _, p := range ps {
					if p.Masked().Contains(a) {
						t.Errorf("%s: %s's subnet %s holds %s, which is %s", sc.File, link, p, a, pl)
					}
				}
			}
		}
		for _, st := range sc.Steps {
			if st.Packet == nil {
				continue
			}
			if _, err := topo.Locate(*st.Packet, st.From, st.Expect); err != nil && !errors.Is(err, features.ErrUnsupported) {
				t.Errorf("%s:%d: Locate: %v", sc.File, st.Line, err)
			}
		}
	}
}

func hostsOf(ps []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, p := range ps {
		out = append(out, p.Addr())
	}
	return out
}

// sameSubnetAs reports whether p shares a subnet (same length) with one of ps, as
// lab.New requires of peers.
func sameSubnetAs(p netip.Prefix, ps []netip.Prefix) bool {
	for _, q := range ps {
		if q.Bits() == p.Bits() && q.Masked() == p.Masked() && q.Addr() != p.Addr() {
			return true
		}
	}
	return false
}

func TestSubnetArithmetic(t *testing.T) {
	for _, c := range []struct{ prefix, last string }{
		{"192.168.0.0/24", "192.168.0.255"},
		{"192.168.0.8/30", "192.168.0.11"},
		{"10.0.0.0/8", "10.255.255.255"},
		{"fd00:168::/123", "fd00:168::1f"},
		{"2001:db8::/64", "2001:db8::ffff:ffff:ffff:ffff"},
	} {
		if got := lastAddr(netip.MustParsePrefix(c.prefix)); got != netip.MustParseAddr(c.last) {
			t.Errorf("lastAddr(%s) = %s, want %s", c.prefix, got, c.last)
		}
	}
	q := netip.MustParsePrefix("192.168.0.8/30")
	for a, want := range map[string]bool{"192.168.0.8": false, "192.168.0.9": true, "192.168.0.10": true, "192.168.0.11": false, "192.168.0.12": false} {
		if got := isHost(q, netip.MustParseAddr(a)); got != want {
			t.Errorf("isHost(%s, %s) = %v, want %v", q, a, got, want)
		}
	}
	taken := map[netip.Addr]bool{netip.MustParseAddr("192.168.0.10"): true}
	if got, ok := pickHost(q, func(a netip.Addr) bool { return !taken[a] }); !ok || got != netip.MustParseAddr("192.168.0.9") {
		t.Errorf("pickHost(%s) = %s, %v; want 192.168.0.9", q, got, ok)
	}
	if got, ok := pickHost(netip.MustParsePrefix("192.168.0.8/31"), func(netip.Addr) bool { return true }); ok {
		t.Errorf("pickHost(/31) = %s, want none", got)
	}
	if p, ok := choose(netip.MustParseAddr("fd00:168::10"), narrowFirst(netip.MustParseAddr("fd00:168::10")), func(netip.Prefix) bool { return true }); !ok || p.Bits() != 123 {
		t.Errorf("choose(fd00:168::10, narrow first) = %s, want a /123", p)
	}
}
