package main

import (
	"bytes"
	"os"
	"path/filepath"
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
	fakes, node, err := buildCluster(o, &bytes.Buffer{}, func(fam knftables.Family, rs *ruleset.Ruleset, res syncer.Result) {
		applied[fam], results[fam] = rs, res
	})
	if err != nil {
		t.Fatal(err)
	}
	if node.Name != "node-a" || len(node.Addresses) != 2 {
		t.Errorf("node %+v; want node-a, the only Node of the file, with its 2 addresses", node)
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
// several Nodes need it; a file without Nodes makes no endpoint local.
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
		{two, "node-c", ""},
		{one, "", "10.2.0.5:8080"},
		{one, "node-a", "10.1.0.5:8080"},
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
	if err == nil || !strings.Contains(err.Error(), "2 Nodes (node-a, node-b)") {
		t.Errorf("two Nodes and no --node: error %v; want it to name both", err)
	}
}
