package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// writeCluster writes a cluster file of the given documents and returns its path.
func writeCluster(t *testing.T, docs ...string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func nodeDoc(name, addr string) string {
	return `apiVersion: v1
kind: Node
metadata: {name: ` + name + `}
status:
  addresses: [{type: InternalIP, address: ` + addr + `}]
`
}

// serviceDocs are a Service and its EndpointSlice, with one endpoint on each of
// node-a (10.1.0.5) and node-b (10.2.0.5). protocol "TCPX" makes the Service invalid.
func serviceDocs(name, ip, itp, protocol string) []string {
	return []string{`apiVersion: v1
kind: Service
metadata: {name: ` + name + `, namespace: default}
spec:
  clusterIP: ` + ip + `
  internalTrafficPolicy: ` + itp + `
  ports: [{name: http, protocol: ` + protocol + `, port: 80, targetPort: 8080}]
`, `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ` + name + `-1
  namespace: default
  labels: {kubernetes.io/service-name: ` + name + `}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
- {addresses: [10.1.0.5], conditions: {ready: true}, nodeName: node-a}
- {addresses: [10.2.0.5], conditions: {ready: true}, nodeName: node-b}
`}
}

func endpointSet(r Result) string {
	var out []string
	for _, e := range r.Endpoints {
		out = append(out, e.Address)
	}
	return strings.Join(out, ",")
}

// TestClusterTablesAreTheProxiers: --cluster builds the tables through a
// proxier.Proxier whose elements go over netlink (decoded into the Fake), and the
// traced table is the ruleset the Proxier applied.
func TestClusterTablesAreTheProxiers(t *testing.T) {
	o, _, err := parseFlags(append(exampleCIDRs, "--cluster", cluster), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	applied := map[knftables.Family]*ruleset.Ruleset{}
	results := map[knftables.Family]syncer.Result{}
	fakes, st, err := buildCluster(o, &bytes.Buffer{}, func(fam knftables.Family, rs *ruleset.Ruleset, res syncer.Result) {
		applied[fam], results[fam] = rs, res
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Node.Name != "node-a" || len(st.Node.Addresses) != 2 {
		t.Errorf("node %+v; want node-a, the only Node of the file, with its 2 addresses", st.Node)
	}
	if len(fakes) != 2 {
		t.Fatalf("%d tables, want one per family", len(fakes))
	}
	for i, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		res, ok := results[fam]
		if !ok {
			t.Fatalf("family %s: no sync reported", fam)
		}
		if !res.Full || res.NetlinkElements == 0 || res.NetlinkElements >= res.Operations {
			t.Errorf("family %s: first sync %+v; want a full sync with the elements over netlink and the rest through nft", fam, res)
		}
		want := knftables.NewFake(fam, o.cfg.Table)
		tx := want.NewTransaction()
		applied[fam].AddTo(tx)
		if err := want.Run(t.Context(), tx); err != nil {
			t.Fatal(err)
		}
		if got, w := fakes[i].Dump(), want.Dump(); got != w {
			t.Errorf("family %s: the traced table differs from the ruleset the Proxier applied:\n%s\nwant:\n%s", fam, got, w)
		}
	}
}

// TestInvalidObjectsAreSkipped: an invalid Service is named on stderr and not
// proxied; the rest of the file is.
func TestInvalidObjectsAreSkipped(t *testing.T) {
	docs := []string{nodeDoc("node-a", "192.168.0.10")}
	docs = append(docs, serviceDocs("good", "172.30.0.10", "Cluster", "TCP")...)
	docs = append(docs, serviceDocs("bad", "172.30.0.11", "Cluster", "TCPX")...)
	file := writeCluster(t, docs...)
	var out, errb bytes.Buffer
	if err := run(append(exampleCIDRs, "--json", "--cluster", file,
		"tcp 10.1.0.9:40000 -> 172.30.0.10:80 iif veth1",
		"tcp 10.1.0.9:40001 -> 172.30.0.11:80 iif veth1"), &out, &errb); err != nil {
		t.Fatalf("nftrace: %v\nstderr: %s", err, errb.String())
	}
	if w := errb.String(); !strings.Contains(w, "nftrace: skipped: ") || !strings.Contains(w, "service default/bad") ||
		!strings.Contains(w, `unsupported protocol "TCPX"`) || strings.Count(w, "\n") != 1 {
		t.Errorf("stderr %q; want one line naming service default/bad and its protocol", w)
	}
	res := decodeResults(t, &out)
	if len(res) != 2 {
		t.Fatalf("%d results, want 2", len(res))
	}
	if got := endpointSet(res[0]); got != "10.1.0.5:8080,10.2.0.5:8080" {
		t.Errorf("pod -> good: endpoints %q; want both of good's", got)
	}
	if len(res[1].Endpoints) != 0 {
		t.Errorf("pod -> bad: endpoints %v; want none, as bad was skipped", res[1].Endpoints)
	}
}

// TestNodeSelection: --node picks the node whose local endpoints an
// internalTrafficPolicy Local Service uses; without it, the only Node of the file;
// several Nodes need it; a file without Nodes makes no endpoint local; a --node
// the file's Nodes do not name is an error listing them.
func TestNodeSelection(t *testing.T) {
	local := serviceDocs("local", "172.30.0.20", "Local", "TCP")
	two := writeCluster(t, append([]string{nodeDoc("node-a", "192.168.0.10"), nodeDoc("node-b", "192.168.0.11")}, local...)...)
	one := writeCluster(t, append([]string{nodeDoc("node-b", "192.168.0.11")}, local...)...)
	none := writeCluster(t, local...)
	const pkt = "tcp 10.1.0.9:40000 -> 172.30.0.20:80 iif veth1"
	for _, tc := range []struct {
		file, node, want string
	}{
		{two, "node-a", "10.1.0.5:8080"},
		{two, "node-b", "10.2.0.5:8080"},
		{one, "", "10.2.0.5:8080"},
		{none, "", ""},
		{none, "node-a", "10.1.0.5:8080"},
	} {
		args := append(exampleCIDRs, "--cluster", tc.file)
		if tc.node != "" {
			args = append(args, "--node", tc.node)
		}
		res := runJSON(t, append(args, pkt)...)
		if got := endpointSet(res[0]); got != tc.want {
			t.Errorf("%s --node %q: endpoints %q, want %q", filepath.Base(filepath.Dir(tc.file)), tc.node, got, tc.want)
		}
	}
	var out, errb bytes.Buffer
	err := run(append(exampleCIDRs, "--cluster", two, pkt), &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "2 Nodes (node-a, node-b): choose one with --node NAME") {
		t.Errorf("two Nodes and no --node: error %v; want it to name both and --node", err)
	}
	err = run(append(exampleCIDRs, "--cluster", two, "--node", "node-c", pkt), &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--node node-c: ") || !strings.Contains(err.Error(), "no Node of that name; its Nodes: node-a, node-b") {
		t.Errorf("--node node-c: error %v; want it to say so and list node-a, node-b", err)
	}
}

// podCIDRNode is a Node with spec.podCIDRs.
func podCIDRNode(name, addr string, cidrs ...string) string {
	return nodeDoc(name, addr) + "spec:\n  podCIDRs: [" + strings.Join(cidrs, ", ") + "]\n"
}

const serviceCIDRDoc = `apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec:
  cidrs: [172.30.0.0/16]
`

// TestCIDRsFromTheCluster: unset by flags and --config, clusterCIDR comes from the
// Nodes' spec.podCIDRs (of all Nodes) and the service CIDR from the ServiceCIDR
// objects, each with a note; what stays unknown is named in one warning.
func TestCIDRsFromTheCluster(t *testing.T) {
	svc := serviceDocs("web", "172.30.0.10", "Cluster", "TCP")
	withCIDRs := writeCluster(t, append([]string{podCIDRNode("node-a", "192.168.0.10", "10.1.0.0/16"),
		podCIDRNode("node-b", "192.168.0.11", "10.2.0.0/16"), serviceCIDRDoc}, svc...)...)
	bare := writeCluster(t, append([]string{nodeDoc("node-a", "192.168.0.10")}, svc...)...)
	for _, tc := range []struct {
		name       string
		args       []string
		wantStderr []string
		wantRules  []string
		notRules   []string
	}{{
		name: "from the cluster",
		args: []string{"--cluster", withCIDRs, "--node", "node-a"},
		wantStderr: []string{
			"nftrace: note: clusterCIDR from the Nodes' spec.podCIDRs: 10.1.0.0/16,10.2.0.0/16\n",
			"nftrace: note: serviceCIDR from the ServiceCIDR objects: 172.30.0.0/16\n",
		},
		wantRules: []string{"10.1.0.0/16", "10.2.0.0/16", "172.30.0.0/16"},
	}, {
		name:       "flags win",
		args:       []string{"--cluster", withCIDRs, "--node", "node-a", "--cluster-cidr", "10.0.0.0/8"},
		wantStderr: []string{"nftrace: note: serviceCIDR from the ServiceCIDR objects: 172.30.0.0/16\n"},
		wantRules:  []string{"10.0.0.0/8"},
		notRules:   []string{"10.1.0.0/16"},
	}, {
		name: "unknown",
		args: []string{"--cluster", bare},
		wantStderr: []string{"nftrace: warning: unknown: clusterCIDR (give --cluster-cidr or --config, or Nodes with spec.podCIDRs), so no traffic is treated as pod traffic; " +
			"serviceCIDR (give --service-cidr or --config, or ServiceCIDR objects), so traffic to unallocated ClusterIPs is not dropped\n"},
		notRules: []string{"10.0.0.0/8", "172.30.0.0/16"},
	}, {
		name:      "given",
		args:      append(exampleCIDRs, "--cluster", bare),
		wantRules: []string{"10.0.0.0/8", "172.30.0.0/16"},
	}} {
		var out, errb bytes.Buffer
		if err := run(append(tc.args, "--print-ruleset"), &out, &errb); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, want := errb.String(), strings.Join(tc.wantStderr, ""); got != want {
			t.Errorf("%s: stderr\n%s\nwant\n%s", tc.name, got, want)
		}
		for _, c := range tc.wantRules {
			if !strings.Contains(out.String(), c) {
				t.Errorf("%s: the ruleset lacks %s", tc.name, c)
			}
		}
		for _, c := range tc.notRules {
			if strings.Contains(out.String(), c) {
				t.Errorf("%s: the ruleset mentions %s", tc.name, c)
			}
		}
	}
}

// TestConfigFile: --config reads the ruleset's settings from nftproxy's and
// kube-proxy's configuration files, and flags override them.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	nftproxy := filepath.Join(dir, "nftproxy.yaml")
	os.WriteFile(nftproxy, []byte(`apiVersion: nftproxy.io/v1alpha1
kind: NftproxyConfiguration
hostnameOverride: node-a
clusterCIDR: 10.0.0.0/8
serviceCIDR: 172.30.0.0/16
syncPeriod: 30s
tableName: kp
`), 0o644)
	for _, tc := range []struct {
		args []string
		want ruleset.Options
	}{
		{[]string{"--config", nftproxy}, ruleset.Options{ClusterCIDR: "10.0.0.0/8", ServiceCIDR: "172.30.0.0/16", TableName: "kp"}},
		{[]string{"--config", nftproxy, "--table-name", "other", "--service-cidr", "10.96.0.0/12"},
			ruleset.Options{ClusterCIDR: "10.0.0.0/8", ServiceCIDR: "10.96.0.0/12", TableName: "other"}},
		{[]string{"--config", "../../cmd/nftproxy/testdata/kubeadm-kube-proxy.yaml"}, ruleset.Options{ClusterCIDR: "10.244.0.0/16"}},
	} {
		o, _, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if !reflect.DeepEqual(o.rs, tc.want) {
			t.Errorf("%q: options %+v, want %+v", tc.args, o.rs, tc.want)
		}
	}
	var out, errb bytes.Buffer
	if err := run([]string{"--config", nftproxy, "--cluster", cluster, "--print-ruleset"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if errb.Len() != 0 || !strings.Contains(out.String(), "table ip kp {") || !strings.Contains(out.String(), "172.30.0.0/16") {
		t.Errorf("--config: stderr %q, ruleset lacks table kp or the service CIDR", errb.String())
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\n"), 0o644)
	if _, _, err := parseFlags([]string{"--config", bad}, io.Discard); err == nil || !strings.Contains(err.Error(), `kind "ConfigMap": want nftproxy.io/v1alpha1 NftproxyConfiguration or kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration`) {
		t.Errorf("--config of a ConfigMap: error %v", err)
	}
}

// TestOtherKindsAreSkipped: a List as `kubectl get all -o yaml` prints it, with Pods,
// a Deployment and a ConfigMap among the Services and EndpointSlices, loads with
// one note counting the kinds skipped.
func TestOtherKindsAreSkipped(t *testing.T) {
	indent := func(doc string) string {
		lines := strings.Split(strings.TrimSuffix(doc, "\n"), "\n")
		return "- " + strings.Join(lines, "\n  ") + "\n"
	}
	items := []string{podCIDRNode("node-a", "192.168.0.10", "10.1.0.0/16")}
	items = append(items, serviceDocs("web", "172.30.0.10", "Cluster", "TCP")...)
	items = append(items, "apiVersion: v1\nkind: Pod\nmetadata: {name: web-1, namespace: default}\nspec: {containers: [{name: c, image: x}]}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: web-2, namespace: default}\n",
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\n")
	list := "apiVersion: v1\nkind: List\nmetadata: {resourceVersion: \"\"}\nitems:\n"
	for _, it := range items {
		list += indent(it)
	}
	file := writeCluster(t, list, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n")
	var out, errb bytes.Buffer
	if err := run([]string{"--json", "--service-cidr", "172.30.0.0/16", "--cluster", file, "tcp 10.1.0.9:40000 -> 172.30.0.10:80 iif veth1"}, &out, &errb); err != nil {
		t.Fatalf("%v\nstderr: %s", err, errb.String())
	}
	if want := "nftrace: note: skipped 4 objects of kinds nftrace does not read: Pod (2), Deployment (1), ConfigMap (1)\n" +
		"nftrace: note: clusterCIDR from the Nodes' spec.podCIDRs: 10.1.0.0/16\n"; errb.String() != want {
		t.Errorf("stderr\n%s\nwant\n%s", errb.String(), want)
	}
	if res := decodeResults(t, &out); len(res) != 1 || endpointSet(res[0]) != "10.1.0.5:8080,10.2.0.5:8080" {
		t.Errorf("results %+v; want web's two endpoints", res)
	}
	// A known kind of another apiVersion is still refused.
	old := writeCluster(t, "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: x}\n")
	if err := run([]string{"--cluster", old, "--print-ruleset"}, &out, &errb); err == nil || !strings.Contains(err.Error(), `unsupported kind "EndpointSlice" of apiVersion "discovery.k8s.io/v1beta1"`) {
		t.Errorf("v1beta1 EndpointSlice: error %v", err)
	}
}

// TestNodelessFile: a file without Nodes warns that node addresses are unknown,
// and with --local they are the node's, so its NodePorts are served there.
func TestNodelessFile(t *testing.T) {
	np := strings.Replace(serviceDocs("np", "172.30.0.30", "Cluster", "TCP")[0], "port: 80,", "port: 80, nodePort: 30080,", 1) +
		"  type: NodePort\n"
	file := writeCluster(t, np, serviceDocs("np", "172.30.0.30", "Cluster", "TCP")[1])
	const pkt = "tcp 203.0.113.9:40000 -> 192.168.0.10:30080 iif eth0"
	var out, errb bytes.Buffer
	if err := run(append(exampleCIDRs, "--json", "--cluster", file, pkt), &out, &errb); err != nil {
		t.Fatal(err)
	}
	if want := "nftrace: warning: unknown: the node's addresses (the file has no Node; give them with --local ADDR,...), so NodePorts and node addresses match nothing\n"; errb.String() != want {
		t.Errorf("stderr %q, want %q", errb.String(), want)
	}
	if res := decodeResults(t, &out); len(res[0].Endpoints) != 0 {
		t.Errorf("NodePort without node addresses: endpoints %v, want none", res[0].Endpoints)
	}
	out.Reset()
	errb.Reset()
	if err := run(append(exampleCIDRs, "--json", "--cluster", file, "--local", "192.168.0.10", pkt), &out, &errb); err != nil {
		t.Fatal(err)
	}
	if errb.Len() != 0 {
		t.Errorf("stderr %q with --local, want nothing", errb.String())
	}
	if res := decodeResults(t, &out); endpointSet(res[0]) != "10.1.0.5:8080,10.2.0.5:8080" {
		t.Errorf("NodePort on --local's address: endpoints %v, want both", res[0].Endpoints)
	}
}

// TestNodelessFileBadLocal: --local is checked before it makes the Node of a file
// without Nodes.
func TestNodelessFileBadLocal(t *testing.T) {
	file := writeCluster(t, serviceDocs("web", "172.30.0.10", "Cluster", "TCP")...)
	var out, errb bytes.Buffer
	err := run([]string{"--cluster", file, "--local", "192.168.0.10,1.2.3", "tcp 10.0.0.1:1 -> 10.0.0.2:2"}, &out, &errb)
	if err == nil || err.Error() != `--local: invalid address "1.2.3"` {
		t.Errorf("error %v, want --local naming 1.2.3", err)
	}
}
