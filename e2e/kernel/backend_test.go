package kernel

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/packet"
)

// probeScenario is a dual-stack cluster whose steps list every packet TestBackendObserves
// sends, so that the lab has their sources and the node's responder their ports.
const probeScenario = `
feature: test
pins: what the kernel backend observes
node:
  addresses: [192.168.0.10, fd00:168::10]
  podCIDRs: [10.1.0.0/16, "fd00:1::/64"]
config:
  clusterCIDR: 10.0.0.0/8,fd00::/28
  serviceCIDR: 172.30.0.0/16,fd00:30::/108
cluster: |
  apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: shop}
  spec:
    type: NodePort
    ipFamilyPolicy: RequireDualStack
    ipFamilies: [IPv4, IPv6]
    clusterIPs: [172.30.0.10, "fd00:30::10"]
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
  ---
  apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-v4
    namespace: shop
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - addresses: [10.1.0.20]
    nodeName: node-a
  - addresses: [10.2.0.21]
    nodeName: node-b
  ---
  apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-v6
    namespace: shop
    labels: {kubernetes.io/service-name: web}
  addressType: IPv6
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - addresses: ["fd00:2::21"]
    nodeName: node-b
  ---
  apiVersion: v1
  kind: Service
  metadata: {name: sticky, namespace: shop}
  spec:
    clusterIP: 172.30.0.11
    sessionAffinity: ClientIP
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
  ---
  apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: sticky-x1
    namespace: shop
    labels: {kubernetes.io/service-name: sticky}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - addresses: [10.1.0.20]
    nodeName: node-a
  - addresses: [10.2.0.21]
    nodeName: node-b
steps:
- {packet: "tcp 10.1.0.5:41000 -> 172.30.0.10:80", expect: {endpoints: [10.1.0.20:8080, 10.2.0.21:8080]}}
- {packet: "tcp 10.2.0.7:41001 -> 172.30.0.10:80", expect: {endpoints: [10.1.0.20:8080, 10.2.0.21:8080]}}
- {packet: "tcp 192.168.0.10:41002 -> 172.30.0.10:80", expect: {endpoints: [10.1.0.20:8080, 10.2.0.21:8080]}}
- {packet: "tcp 203.0.113.7:41003 -> 192.168.0.10:22", expect: {verdict: local}}
- {packet: "tcp [fd00:1::5]:41004 -> [fd00:30::10]:81", expect: {verdict: reject}}
`

// TestBackendObserves sends packets through the production ruleset in a lab and checks
// that right expectations pass and wrong ones fail: the observations discriminate.
func TestBackendObserves(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	sc := parse(t, probeScenario)
	b := New()
	if _, err := features.Start(sc, b); err != nil {
		t.Fatal(err)
	}
	id := b.Lab().ID
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		names, err := lab.LeaksOf([]string{id})
		if err != nil {
			t.Error(err)
		}
		for _, n := range names {
			t.Errorf("namespace %s left behind", n)
		}
	})

	yes, no := true, false
	node4 := netip.MustParseAddr("192.168.0.10")
	both := []netip.AddrPort{netip.MustParseAddrPort("10.1.0.20:8080"), netip.MustParseAddrPort("10.2.0.21:8080")}
	for _, c := range []struct {
		name string
		pkt  string
		from features.Origin
		exp  features.Expect
		pass bool
	}{
		{"pod to ClusterIP", "tcp 10.1.0.5:41000 -> 172.30.0.10:80", features.FromPod,
			features.Expect{Endpoints: both, Masquerade: &no, Source: ptr(netip.MustParseAddr("10.1.0.5"))}, true},
		{"only one of the endpoints", "tcp 10.1.0.5:41000 -> 172.30.0.10:80", features.FromPod,
			features.Expect{Endpoints: both[:1]}, false},
		{"a pod masqueraded", "tcp 10.1.0.5:41000 -> 172.30.0.10:80", features.FromPod,
			features.Expect{Endpoints: both, Masquerade: &yes}, false},
		{"a remote pod through the node, answered back through it", "tcp 10.2.0.7:41001 -> 172.30.0.10:80", features.FromRemotePod,
			features.Expect{Endpoints: both, Masquerade: &no, Source: ptr(netip.MustParseAddr("10.2.0.7"))}, true},
		{"the node, masqueraded to its own address", "tcp 192.168.0.10:41002 -> 172.30.0.10:80", features.FromNode,
			features.Expect{Endpoints: both, Masquerade: &yes, Source: &node4}, true},
		{"the node unmasqueraded", "tcp 192.168.0.10:41002 -> 172.30.0.10:80", features.FromNode,
			features.Expect{Endpoints: both, Masquerade: &no}, false},
		{"another port of the ClusterIP rejects", "tcp 10.1.0.5:41000 -> 172.30.0.10:81", features.FromPod,
			features.Expect{Reject: true}, true},
		{"... which is no drop", "tcp 10.1.0.5:41000 -> 172.30.0.10:81", features.FromPod,
			features.Expect{Drop: true}, false},
		{"over IPv6 too", "tcp [fd00:1::5]:41004 -> [fd00:30::10]:81", features.FromPod,
			features.Expect{Reject: true}, true},
		{"an unallocated service address is dropped", "tcp 10.1.0.5:41000 -> 172.30.0.99:80", features.FromPod,
			features.Expect{Drop: true}, true},
		{"... not passed on", "tcp 10.1.0.5:41000 -> 172.30.0.99:80", features.FromPod,
			features.Expect{Unhandled: true}, false},
		{"an address outside the service CIDR passes on", "tcp 10.1.0.5:41000 -> 172.31.0.10:80", features.FromPod,
			features.Expect{Unhandled: true}, true},
		{"... and is not dropped", "tcp 10.1.0.5:41000 -> 172.31.0.10:80", features.FromPod,
			features.Expect{Drop: true}, false},
		{"a port of the node", "tcp 203.0.113.7:41003 -> 192.168.0.10:22", features.FromExternal,
			features.Expect{Local: true}, true},
		{"the node port is no port of the node", "tcp 203.0.113.7:41003 -> 192.168.0.10:30080", features.FromExternal,
			features.Expect{Local: true}, false},
		{"the node port", "tcp 203.0.113.7:41003 -> 192.168.0.10:30080", features.FromExternal,
			features.Expect{Endpoints: both, Masquerade: &yes, Source: &node4}, true},
	} {
		p, err := packet.Parse(c.pkt)
		if err != nil {
			t.Fatal(err)
		}
		obs, err := b.Send(p, c.from, &c.exp)
		if err != nil {
			t.Errorf("%s: Send(%s): %v", c.name, c.pkt, err)
			continue
		}
		if err := features.Check(&c.exp, obs, netip.AddrPort{}); (err == nil) != c.pass {
			t.Errorf("%s: %s expecting %s: check error %v, want pass=%v\n%s", c.name, c.pkt, &c.exp, err, c.pass, obs.Trace)
		}
		if obs.Trace == "" || !strings.Contains(obs.Trace, "kernel lab "+id) {
			t.Errorf("%s: the observation's trace does not describe the lab", c.name)
		}
	}

	// Session affinity: a new client may get either endpoint (the backend resets the
	// client's affinity between samples), and then sticks to the last one.
	p, _ := packet.Parse("tcp 10.1.0.5:41005 -> 172.30.0.11:80")
	exp := &features.Expect{Endpoints: both}
	obs, err := b.Send(p, features.FromPod, exp)
	if err != nil {
		t.Fatal(err)
	}
	if err := features.Check(exp, obs, netip.AddrPort{}); err != nil {
		t.Errorf("new affinity client: %v", err)
	}
	chosen := obs.Chosen
	sticky := &features.Expect{Endpoints: both, Sticky: true}
	if obs, err = b.Send(p, features.FromPod, sticky); err != nil {
		t.Fatal(err)
	}
	if err := features.Check(sticky, obs, chosen); err != nil {
		t.Errorf("affinity client's next connection: %v", err)
	}

	// What the lab cannot reproduce is skipped, not failed.
	p, _ = packet.Parse("tcp 10.1.0.5:41000 -> 172.30.0.10:80 iif eth9")
	if _, err := b.Send(p, features.FromPod, exp); !errors.Is(err, features.ErrUnsupported) {
		t.Errorf("Send with iif eth9 = %v, want ErrUnsupported", err)
	}
	if err := b.Advance(MaxSleep + time.Second); !errors.Is(err, features.ErrUnsupported) {
		t.Errorf("Advance beyond MaxSleep = %v, want ErrUnsupported", err)
	}
	p, _ = packet.Parse("tcp 10.1.0.5:41005 -> 172.30.0.11:80")
	if _, err := b.Send(p, features.FromPod, sticky); !errors.Is(err, features.ErrUnsupported) {
		t.Errorf("Send to an affinity Service after a skipped advance = %v, want ErrUnsupported", err)
	}
	// web has no session affinity: its packets still run.
	p, _ = packet.Parse("tcp 10.1.0.5:41000 -> 172.30.0.10:80")
	if _, err := b.Send(p, features.FromPod, exp); err != nil {
		t.Errorf("Send to a Service without affinity after a skipped advance: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }
