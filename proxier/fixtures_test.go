package proxier

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// testTable is the table name the tests use; knftables.Fake never touches the kernel.
const testTable = "nftproxy-test"

// flakyNFT is a knftables.Interface over a Fake whose Run fails while failing is set.
type flakyNFT struct {
	*knftables.Fake
	mu      sync.Mutex
	failing bool
	runs    int
}

func (f *flakyNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	f.mu.Lock()
	f.runs++
	failing := f.failing
	f.mu.Unlock()
	if failing {
		return errors.New("injected nft failure")
	}
	return f.Fake.Run(ctx, tx)
}

func (f *flakyNFT) setFailing(v bool) {
	f.mu.Lock()
	f.failing = v
	f.mu.Unlock()
}

// fakes holds the Fake of each family a test Proxier opened.
type fakes map[knftables.Family]*flakyNFT

func (fs fakes) newNFT(family knftables.Family, table string) (knftables.Interface, error) {
	f := &flakyNFT{Fake: knftables.NewFake(family, table)}
	fs[family] = f
	return f, nil
}

// newTestProxier returns a Proxier for node-a over Fakes, with the ClusterCIDR
// detector, adjusted by mod.
func newTestProxier(t *testing.T, mod func(*Config)) (*Proxier, fakes) {
	t.Helper()
	fs := fakes{}
	cfg := Config{
		NodeName: "node-a",
		Ruleset: ruleset.Config{
			Table: testTable, LocalMode: ruleset.LocalClusterCIDR,
			ClusterCIDRs: prefixes("10.0.0.0/8", "fd01::/48"),
			ServiceCIDRs: prefixes("172.30.0.0/16", "fd02::/112"),
		},
		NewNFT: fs.newNFT,
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p, fs
}

func mustSync(t *testing.T, p *Proxier) {
	t.Helper()
	if err := p.Sync(context.Background()); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// port is a Service port for service().
type port struct {
	name     string
	proto    v1.Protocol
	port     int32
	nodePort int32
}

// service returns a ClusterIP Service ns/name at clusterIP with ports.
func service(ns, name, clusterIP string, ports ...port) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
		},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: p.name, Protocol: p.proto, Port: p.port, NodePort: p.nodePort})
		if p.nodePort != 0 {
			svc.Spec.Type = v1.ServiceTypeNodePort
		}
	}
	return svc
}

// endpoint is one endpoint of a slice().
type endpoint struct {
	ip   string
	node string
}

// slice returns an IPv4 EndpointSlice of Service ns/svc whose ports are named and
// numbered as given, on port targetPort each.
func slice(ns, svc, name string, ports []port, eps ...endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.name), Protocol: ptr.To(p.proto), Port: ptr.To(p.port)})
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, NodeName: ptr.To(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

// node returns Node node-a with the given addresses.
func node(addrs ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	return n
}

// dispatch returns the verdict dispatch chain c of f's table gives the frontend key
// (the verdict of the class set that holds it), or "" when none does.
func dispatch(t *testing.T, f *flakyNFT, c string, key ...string) string {
	t.Helper()
	f.RLock()
	defer f.RUnlock()
	if f.Table == nil {
		t.Fatalf("table %s does not exist", testTable)
	}
	if f.Table.Chains[c] == nil {
		t.Fatalf("chain %s does not exist", c)
	}
	for name, set := range f.Table.Sets {
		if chain, verdict, ok := ruleset.ClassOf(name); ok && chain == c && set.FindElement(key...) != nil {
			return verdict
		}
	}
	return ""
}

func lastTransaction(f *flakyNFT) string {
	f.RLock()
	defer f.RUnlock()
	if f.LastTransaction == nil {
		return ""
	}
	return f.LastTransaction.String()
}

var (
	httpPort = port{"http", v1.ProtocolTCP, 80, 0}
	dnsPort  = port{"dns", v1.ProtocolUDP, 53, 0}
)

// target returns p with its number changed to n (an EndpointSlice's target port).
func target(p port, n int32) port { p.port = n; return p }

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func webService() *v1.Service { return service("default", "web", "172.30.0.10", httpPort) }

func webSlice(eps ...endpoint) *discoveryv1.EndpointSlice {
	return slice("default", "web", "web-1", []port{target(httpPort, 8080)}, eps...)
}

func ep(ip, node string) endpoint { return endpoint{ip, node} }

func keyOf(ip string, proto string, p int32) []string {
	return []string{ip, proto, fmt.Sprint(p)}
}
