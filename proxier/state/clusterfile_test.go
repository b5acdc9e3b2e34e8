package state

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const exampleFile = "../../examples/cluster.yaml"

func TestExampleClusterFile(t *testing.T) {
	for _, node := range []string{"node-a", ""} {
		st, errs, err := LoadClusterFile(exampleFile, node)
		if err != nil {
			t.Fatalf("LoadClusterFile(%q): %v", node, err)
		}
		if len(errs) != 0 {
			t.Fatalf("LoadClusterFile(%q): object errors %v", node, errs)
		}
		wantNode := Node{Name: "node-a", Zone: "z1", Addresses: addrs("192.168.0.10", "fd00:168::10"), PrimaryIPs: addrs("192.168.0.10", "fd00:168::10"),
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:1::/64")}}
		if diff := cmp.Diff(wantNode, st.Node, cmpNet); diff != "" {
			t.Errorf("node (-want +got):\n%s", diff)
		}
		wantServices := []string{
			"default/api", "default/dual", "default/empty", "default/ingress", "default/legacy",
			"default/sticky", "default/web", "kube-system/kube-dns",
		}
		if diff := cmp.Diff(wantServices, serviceNames(st)); diff != "" {
			t.Errorf("Services (-want +got):\n%s", diff)
		}
		nSlices := 0
		for _, s := range st.Slices {
			nSlices += len(s)
		}
		if nSlices != 8 || len(st.Slices) != 7 || st.Slices[sn("empty")] != nil {
			t.Errorf("%d slices of %d Services, want 8 of 7 (all but empty)", nSlices, len(st.Slices))
		}
	}

	st, _, err := LoadClusterFile(exampleFile, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	svc := func(ns, name string) *Service {
		s := st.Services[ServiceName{Namespace: ns, Name: name}]
		if s == nil {
			t.Fatalf("no Service %s/%s", ns, name)
		}
		return s
	}
	want := &Service{
		Name: sn("ingress"), Type: TypeLoadBalancer,
		ClusterIPs:          addrs("172.30.0.12"),
		LoadBalancerIPs:     addrs("192.0.2.100"),
		SourceRanges:        prefixes("203.0.113.0/24", "198.51.100.7/32"),
		ExternalPolicyLocal: true,
		HealthCheckNodePort: 32000,
		Ports:               []ServicePort{{Name: "https", Protocol: TCP, Port: 443, NodePort: 30443}},
	}
	if diff := cmp.Diff(want, svc("default", "ingress"), cmpNet); diff != "" {
		t.Errorf("ingress (-want +got):\n%s", diff)
	}
	if got := svc("default", "api").Ports[0].NodePort; got != 30080 {
		t.Errorf("api node port %d, want 30080", got)
	}
	if got := svc("default", "legacy").ExternalIPs; !slices.Equal(got, addrs("192.168.0.100")) {
		t.Errorf("legacy external IPs %v", got)
	}
	if got := svc("default", "sticky").AffinityTimeout; got != 10*time.Minute {
		t.Errorf("sticky affinity %v, want 10m", got)
	}
	if got := svc("default", "dual").ClusterIPs; !slices.Equal(got, addrs("172.30.0.16", "fd00:30::16")) {
		t.Errorf("dual cluster IPs %v", got)
	}
	dns := svc("kube-system", "kube-dns")
	if len(dns.Ports) != 2 || dns.Ports[0].Protocol != UDP || dns.Ports[1].Protocol != TCP {
		t.Errorf("kube-dns ports %+v, want dns/udp and dns-tcp/tcp", dns.Ports)
	}

	// The endpoints as the ruleset builder will see them.
	selected := func(s *Service) (cluster, local []string) {
		sel := Select(s, st.Endpoints(s, s.Ports[0]), st.Node)
		return addrsOf(sel.Cluster), addrsOf(sel.Local)
	}
	web := svc("default", "web")
	if c, l := selected(web); !slices.Equal(c, []string{"10.1.0.5", "10.2.0.5"}) || !slices.Equal(l, []string{"10.1.0.5"}) {
		t.Errorf("web: cluster %v local %v", c, l)
	}
	if eps := st.Endpoints(web, web.Ports[0]); eps[0].Port != 8080 {
		t.Errorf("web endpoint port %d, want 8080", eps[0].Port)
	}
	if c, _ := selected(svc("default", "api")); !slices.Equal(c, []string{"10.1.0.6"}) {
		t.Errorf("api: cluster %v, want only the ready endpoint", c)
	}
	if c, _ := selected(dns); !slices.Equal(c, []string{"10.1.0.2"}) {
		t.Errorf("kube-dns: cluster %v, want the zone z1 endpoint by its hint", c)
	}
	if c, _ := selected(svc("default", "dual")); !slices.Equal(c, []string{"10.1.0.10", "fd00:1::10", "fd00:2::10"}) {
		t.Errorf("dual: cluster %v", c)
	}
	if sel := Select(svc("default", "empty"), st.Endpoints(svc("default", "empty"), svc("default", "empty").Ports[0]), st.Node); sel.Any {
		t.Errorf("empty has endpoints: %+v", sel)
	}
}

func TestLoadClusterUnknownField(t *testing.T) {
	_, _, err := LoadClusterFile("testdata/typo.yaml", "node-a")
	want := `testdata/typo.yaml: document 3 (line 27): service default/web: unknown field "spec.clusterIp"`
	if err == nil || err.Error() != want {
		t.Fatalf("error %v\nwant %s", err, want)
	}
	var de *DocumentError
	if !errors.As(err, &de) || de.File != "testdata/typo.yaml" || de.Document != 3 || de.Line != 27 {
		t.Errorf("error %#v, want a *DocumentError at document 3, line 27", err)
	}
	var oe *ObjectError
	if !errors.As(err, &oe) || oe.Name != "web" || !slices.Equal(oe.Fields, []string{"spec.clusterIp"}) {
		t.Errorf("error %#v, want an *ObjectError of web naming spec.clusterIp", err)
	}
}

// loadString loads a cluster file held in a string, named test.yaml.
func loadString(text, node string) (*ClusterState, []error, error) {
	return LoadCluster(strings.NewReader(text), "test.yaml", node)
}

func TestLoadClusterFatalErrors(t *testing.T) {
	const svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: 172.30.0.10\n"
	tests := []struct {
		name, text string
		want       string // the whole message
	}{
		{
			"bad YAML",
			svc + "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: x\n   namespace: y\n",
			"test.yaml: document 2 (line 12): invalid YAML: mapping values are not allowed in this context",
		},
		{
			"bad separator",
			svc + "--- oops\n" + svc,
			`test.yaml: document 1 (line 7): invalid Yaml document separator: oops`,
		},
		{
			"unknown kind",
			svc + "---\n# a config map\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
			`test.yaml: document 2 (line 9): unsupported kind "ConfigMap" of apiVersion "v1": want v1 Service, discovery.k8s.io/v1 EndpointSlice, v1 Node, networking.k8s.io/v1 ServiceCIDR or v1 List`,
		},
		{
			"unknown apiVersion",
			"apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata:\n  name: x\n",
			`test.yaml: document 1 (line 1): unsupported kind "EndpointSlice" of apiVersion "discovery.k8s.io/v1beta1": want v1 Service, discovery.k8s.io/v1 EndpointSlice, v1 Node, networking.k8s.io/v1 ServiceCIDR or v1 List`,
		},
		{
			"no kind",
			"apiVersion: v1\nmetadata:\n  name: x\n",
			"test.yaml: document 1 (line 1): no kind",
		},
		{
			"not an object",
			"- a\n- b\n",
			"test.yaml: document 1 (line 1): not a Kubernetes object",
		},
		{
			"wrong type of value",
			svc + "  ports:\n  - port: eighty\n",
			"test.yaml: document 1 (line 1): service default/web: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32",
		},
		{
			"duplicate field",
			svc + "  clusterIP: 172.30.0.11\n",
			`test.yaml: document 1 (line 7): invalid YAML: key "clusterIP" already set in map`,
		},
		{
			"unknown fields in a slice, all reported",
			"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: s\n  namespace: ns\naddressType: IPv4\nendpoints:\n- addresses: [10.1.0.5]\n  condition:\n    ready: true\n  nodename: n\n",
			`test.yaml: document 1 (line 9): endpointslice ns/s: unknown field "endpoints[0].condition"; unknown field "endpoints[0].nodename"`,
		},
		{
			"unknown field in a Node",
			"apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a\nstatus:\n  address: []\n",
			`test.yaml: document 1 (line 6): node node-a: unknown field "status.address"`,
		},
		{
			"unknown field in a List item",
			"apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(svc, "\n", "\n  ") + "  typ: NodePort\n",
			`test.yaml: document 1 (line 10): items[0]: service default/web: unknown field "spec.typ"`,
		},
		{
			"two Nodes and no name",
			"apiVersion: v1\nkind: Node\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: b\n",
			"test.yaml: 2 Nodes (a, b) and no node name to choose one",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, errs, err := loadString(tt.text, "")
			if err == nil {
				t.Fatalf("no error; state %+v, errors %v", st, errs)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n%s\nwant:\n%s", err, tt.want)
			}
		})
	}
}

func TestLoadClusterObjectErrors(t *testing.T) {
	st, errs, err := LoadClusterFile("testdata/broken.yaml", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	want := []string{
		`testdata/broken.yaml: document 2 (line 25): service default/bad: spec.ports[1].protocol: unsupported protocol "TCPX"`,
		`testdata/broken.yaml: document 4 (line 43): endpointslice default/orphan-1: metadata.labels[kubernetes.io/service-name]: required: names the slice's Service`,
		`testdata/broken.yaml: document 5 (line 51): service default/web: duplicate of document 1 (line 3), skipped`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	var oe *ObjectError
	if !errors.As(errs[0], &oe) || oe.Name != "bad" || !slices.Equal(oe.Fields, []string{"spec.ports[1].protocol"}) {
		t.Errorf("errors.As(%v) finds no *ObjectError of bad", errs[0])
	}

	// Everything else loaded, and the first web won over its duplicate.
	if diff := cmp.Diff([]string{"default/web"}, serviceNames(st)); diff != "" {
		t.Errorf("Services (-want +got):\n%s", diff)
	}
	if ip := st.Services[sn("web")].ClusterIPs[0]; ip != netip.MustParseAddr("172.30.0.10") {
		t.Errorf("web has cluster IP %s, want the first definition's", ip)
	}
	if got := sliceNames(st, "web"); !slices.Equal(got, []string{"web-1"}) {
		t.Errorf("web slices %v", got)
	}
	if diff := cmp.Diff(Node{Name: "node-a"}, st.Node, cmpNet); diff != "" {
		t.Errorf("a node without Node in the file (-want +got):\n%s", diff)
	}
}

func TestLoadClusterNodeChoice(t *testing.T) {
	const nodes = `
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: z1}
---
apiVersion: v1
kind: Node
metadata:
  name: node-b
  labels: {topology.kubernetes.io/zone: z2}
status:
  addresses:
  - {type: InternalIP, address: 192.168.0.999}
`
	tests := []struct {
		name, text, node string
		want             Node
		errs             int
	}{
		{"the only Node", nodes[:strings.Index(nodes, "---")], "", Node{Name: "node-a", Zone: "z1"}, 0},
		{"a named Node", nodes, "node-a", Node{Name: "node-a", Zone: "z1"}, 0},
		{"a named Node that is broken", nodes, "node-b", Node{Name: "node-b"}, 1},
		{"a Node missing from the file", nodes, "node-c", Node{Name: "node-c"}, 0},
		{"no Node at all", "# empty\n", "", Node{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, errs, err := loadString(tt.text, tt.node)
			if err != nil {
				t.Fatal(err)
			}
			if len(errs) != tt.errs {
				t.Errorf("errors %v, want %d", errs, tt.errs)
			}
			if diff := cmp.Diff(tt.want, st.Node, cmpNet); diff != "" {
				t.Errorf("node (-want +got):\n%s", diff)
			}
		})
	}
	_, errs, _ := loadString(nodes, "node-b")
	want := "test.yaml: document 2 (line 15): node node-b: status.addresses[0].address: invalid IP address"
	if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), want) {
		t.Errorf("errors %v, want one starting %q", errs, want)
	}
}

func TestLoadClusterList(t *testing.T) {
	// As `kubectl get svc,endpointslices -o yaml` prints it, with CRLF line ends.
	text := `apiVersion: v1
kind: List
metadata:
  resourceVersion: ""
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: web
    namespace: shop
    uid: 0b0d4d6c-8b8e-4a52-9d36-1f0c8a8f0a11
    resourceVersion: "1234"
    creationTimestamp: "2025-01-01T00:00:00Z"
  spec:
    clusterIP: 172.30.0.10
    clusterIPs: [172.30.0.10]
    ports:
    - {name: http, port: 80, protocol: TCP, targetPort: 8080}
  status:
    loadBalancer: {}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-1
    namespace: shop
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - addresses: [10.1.0.5]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-2
    namespace: shop
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCPX}]
`
	text = strings.ReplaceAll(text, "\n", "\r\n")
	st, errs, err := loadString(text, "")
	if err != nil {
		t.Fatal(err)
	}
	name := ServiceName{Namespace: "shop", Name: "web"}
	if st.Services[name] == nil || len(st.Slices[name]) != 1 || st.Slices[name]["web-1"] == nil {
		t.Errorf("state %+v, want shop/web with slice web-1", st)
	}
	want := `test.yaml: document 1 (line 38): items[2]: endpointslice shop/web-2: ports[0].protocol: unsupported protocol "TCPX"`
	if len(errs) != 1 || errs[0].Error() != want {
		t.Errorf("errors %v\nwant [%s]", errs, want)
	}
}

func TestLoadClusterFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, _, err := LoadClusterFile(path, "")
	if err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %v, want one naming %s and wrapping os.ErrNotExist", err, path)
	}
}
