package ruleset

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

var update = flag.Bool("update", false, "rewrite the testdata/*.nft goldens from Build's output")

var (
	ipv4 = []knftables.Family{knftables.IPv4Family}
	ipv6 = []knftables.Family{knftables.IPv6Family}
	dual = []knftables.Family{knftables.IPv4Family, knftables.IPv6Family}
)

// golden is one feature's input; its output is testdata/<name>.nft.
type golden struct {
	name     string
	families []knftables.Family
	// config changes baseConfig; nil keeps it.
	config  func(*Config)
	cluster func(*state.ClusterState)
}

var goldens = []golden{
	{name: "clusterip", families: ipv4, cluster: func(st *state.ClusterState) {
		// Three ready endpoints, one not ready (left out), and an IPv6 slice that
		// the ip table ignores.
		web := addService(st, "default/web", "172.30.0.10", ports(tcp("http", 80, 0)))
		addSlice(st, web, "web-1", targets(web, 8080),
			ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"), ep("10.3.0.7", "node-c"), ep("10.3.0.8", "node-c", notReady))
		addSlice(st, web, "web-v6", targets(web, 8080), ep("fd01::5", nodeName))
		// An unnamed port is named by its number; a second Service with the same
		// endpoint count shares dnat-1.
		api := addService(st, "kube-system/api", "172.30.0.1", ports(tcp("", 443, 0)))
		addSlice(st, api, "api-1", targets(api, 6443), ep("192.168.0.10", nodeName))
		dns := addService(st, "kube-system/dns", "172.30.0.53", ports(udp("dns", 53, 0), tcp("dns-tcp", 53, 0)))
		addSlice(st, dns, "dns-1", targets(dns, 5353), ep("10.2.0.9", "node-b"))
	}},
	{name: "clusterip-no-endpoints", families: ipv4, cluster: func(st *state.ClusterState) {
		addService(st, "default/empty", "172.30.0.20", ports(tcp("http", 80, 0)))
		unready := addService(st, "default/unready", "172.30.0.21", ports(tcp("http", 80, 0)))
		addSlice(st, unready, "unready-1", targets(unready, 8080), ep("10.1.0.5", nodeName, notReady))
		// A Service with a ClusterIP of the other family only is not in this table.
		addService(st, "default/v6only", "fd02::20", ports(tcp("http", 80, 0)))
	}},
	{name: "nodeport", families: ipv4, config: func(c *Config) {
		// 10.10.0.10 is outside these prefixes; 127.0.0.1 is inside but loopback
		// never serves node ports.
		c.NodePortAddresses = prefixes("192.168.0.0/24", "127.0.0.0/8", "fd00::/8")
	}, cluster: func(st *state.ClusterState) {
		web := addService(st, "default/web", "172.30.0.10", nodePortType, ports(tcp("http", 80, 30080), udp("syslog", 514, 30514)))
		addSlice(st, web, "web-1", targets(web, 8080), ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"))
		addService(st, "default/empty", "172.30.0.11", nodePortType, ports(tcp("http", 80, 30081)))
	}},
	{name: "loadbalancer", families: ipv4, cluster: func(st *state.ClusterState) {
		web := addService(st, "default/web", "172.30.0.10", loadBalancer("203.0.113.10", "2001:db8::10"), ports(tcp("https", 443, 30443)))
		addSlice(st, web, "web-1", targets(web, 8443), ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"))
		addService(st, "default/empty", "172.30.0.11", loadBalancer("203.0.113.11"), ports(tcp("https", 443, 30444)))
	}},
	{name: "externalips", families: ipv4, cluster: func(st *state.ClusterState) {
		web := addService(st, "default/web", "172.30.0.10", externalIPs("198.51.100.20", "198.51.100.21"), ports(tcp("http", 80, 0)))
		addSlice(st, web, "web-1", targets(web, 8080), ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"), ep("10.3.0.7", "node-c"))
		addService(st, "default/empty", "172.30.0.11", externalIPs("198.51.100.22"), ports(tcp("http", 80, 0)))
		// This ExternalIP is another Service's ClusterIP, and the second one is
		// taken by default/web, first in name order: neither goes to default/web-copy.
		cp := addService(st, "default/web-copy", "172.30.0.12", externalIPs("172.30.0.10", "198.51.100.20"), ports(tcp("http", 80, 0)))
		addSlice(st, cp, "web-copy-1", targets(cp, 9090), ep("10.9.0.9", "node-b"))
	}},
	{name: "etp-local", families: ipv4, cluster: func(st *state.ClusterState) {
		// With a local endpoint: external traffic goes to it alone, pod and node
		// traffic to all three.
		web := addService(st, "default/web", "172.30.0.10", loadBalancer("203.0.113.10"), externalIPs("198.51.100.20"), etpLocal, ports(tcp("http", 80, 30080)))
		addSlice(st, web, "web-1", targets(web, 8080), ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"), ep("10.3.0.7", "node-c"))
		// Without one: external traffic is dropped, pod and node traffic still
		// reaches both remote endpoints.
		remote := addService(st, "default/remote", "172.30.0.11", loadBalancer("203.0.113.11"), etpLocal, ports(tcp("http", 80, 30081)))
		addSlice(st, remote, "remote-1", targets(remote, 8080), ep("10.2.0.7", "node-b"), ep("10.3.0.8", "node-c"))
		// Without any endpoint: rejected like any Service.
		addService(st, "default/empty", "172.30.0.12", loadBalancer("203.0.113.12"), etpLocal, ports(tcp("http", 80, 30082)))
	}},
	{name: "itp-local", families: ipv4, cluster: func(st *state.ClusterState) {
		local := addService(st, "default/local", "172.30.0.10", itpLocal, ports(tcp("http", 80, 0)))
		addSlice(st, local, "local-1", targets(local, 8080), ep("10.1.0.5", nodeName), ep("10.1.0.6", nodeName), ep("10.2.0.6", "node-b"))
		remote := addService(st, "default/remote", "172.30.0.11", itpLocal, ports(tcp("http", 80, 0)))
		addSlice(st, remote, "remote-1", targets(remote, 8080), ep("10.2.0.7", "node-b"))
		addService(st, "default/empty", "172.30.0.12", itpLocal, ports(tcp("http", 80, 0)))
		// internalTrafficPolicy leaves node ports alone: they use all endpoints.
		np := addService(st, "default/np", "172.30.0.13", itpLocal, nodePortType, ports(tcp("http", 80, 30080)))
		addSlice(st, np, "np-1", targets(np, 8080), ep("10.2.0.8", "node-b"))
	}},
	{name: "affinity", families: ipv4, cluster: func(st *state.ClusterState) {
		web := addService(st, "default/web", "172.30.0.10", nodePortType, affinity(3*time.Hour), ports(tcp("http", 80, 30080)))
		addSlice(st, web, "web-1", targets(web, 8080), ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"))
		// Under externalTrafficPolicy Local, external traffic uses affinity-local,
		// whose endpoint chains and sets are the cluster chain's.
		lb := addService(st, "default/lb", "172.30.0.11", loadBalancer("203.0.113.11"), etpLocal, affinity(90*time.Second), ports(udp("dns", 53, 30053)))
		addSlice(st, lb, "lb-1", targets(lb, 5353), ep("10.1.0.7", nodeName), ep("10.2.0.7", "node-b"), ep("10.3.0.7", "node-c"))
	}},
	{name: "source-ranges", families: ipv4, cluster: func(st *state.ClusterState) {
		// Only the LoadBalancer IP is firewalled: not the ExternalIP, not the node
		// port. The IPv6 range is another family's; the overlapping ones merge.
		web := addService(st, "default/web", "172.30.0.10", loadBalancer("203.0.113.10"), externalIPs("198.51.100.20"),
			sourceRanges("192.0.2.0/24", "192.0.2.128/25", "198.51.100.7/32", "2001:db8::/32"), ports(tcp("http", 80, 30080)))
		addSlice(st, web, "web-1", targets(web, 8080), ep("10.1.0.5", nodeName))
		// Ranges of the other family only: every IPv4 source is dropped.
		v6src := addService(st, "default/v6src", "172.30.0.11", loadBalancer("203.0.113.11"), sourceRanges("2001:db8::/32"), ports(tcp("http", 80, 30081)))
		addSlice(st, v6src, "v6src-1", targets(v6src, 8080), ep("10.1.0.6", nodeName))
	}},
	{name: "masquerade-all", families: ipv4, config: func(c *Config) {
		c.MasqueradeAll = true
		c.MasqueradeBit = 5
	}, cluster: simpleCluster},
	{name: "interface-prefix", families: ipv4, config: func(c *Config) {
		c.LocalMode = LocalInterfacePrefix
		c.InterfacePrefix = "veth"
	}, cluster: simpleCluster},
	{name: "no-detector", families: ipv4, config: func(c *Config) {
		c.LocalMode = LocalNone
		c.ClusterCIDRs = nil
		c.ServiceCIDRs = nil
		c.Table = "proxy-test"
	}, cluster: simpleCluster},
	{name: "terminating", families: ipv4, cluster: func(st *state.ClusterState) {
		// No ready endpoint: the serving terminating ones take the traffic, the
		// not-serving one never does.
		web := addService(st, "default/web", "172.30.0.10", etpLocal, loadBalancer("203.0.113.10"), ports(tcp("http", 80, 0)))
		addSlice(st, web, "web-1", targets(web, 8080),
			ep("10.1.0.5", nodeName, terminating(true)), ep("10.2.0.6", "node-b", terminating(true)), ep("10.3.0.7", "node-c", terminating(false)))
		// A ready endpoint elsewhere: the local terminating one still serves
		// external traffic, since this node has no ready one.
		mixed := addService(st, "default/mixed", "172.30.0.11", etpLocal, loadBalancer("203.0.113.11"), ports(tcp("http", 80, 0)))
		addSlice(st, mixed, "mixed-1", targets(mixed, 8080), ep("10.1.0.8", nodeName, terminating(true)), ep("10.2.0.8", "node-b"))
		gone := addService(st, "default/gone", "172.30.0.12", ports(tcp("http", 80, 0)))
		addSlice(st, gone, "gone-1", targets(gone, 8080), ep("10.1.0.9", nodeName, terminating(false)))
	}},
	{name: "topology", families: ipv4, cluster: func(st *state.ClusterState) {
		// Every ready endpoint has hints and one names zone-a: only it is used.
		hinted := addService(st, "default/hinted", "172.30.0.10", ports(tcp("http", 80, 0)))
		addSlice(st, hinted, "hinted-1", targets(hinted, 8080),
			ep("10.1.0.5", nodeName, zone("zone-a"), hints("zone-a")),
			ep("10.2.0.6", "node-b", zone("zone-b"), hints("zone-b")),
			ep("10.3.0.7", "node-c", zone("zone-b"), hints("zone-b")))
		// One ready endpoint without hints: hints are ignored.
		partial := addService(st, "default/partial", "172.30.0.11", ports(tcp("http", 80, 0)))
		addSlice(st, partial, "partial-1", targets(partial, 8080),
			ep("10.1.0.6", nodeName, zone("zone-a"), hints("zone-a")),
			ep("10.2.0.7", "node-b", zone("zone-b")))
	}},
	{name: "sctp-udp", families: ipv4, cluster: func(st *state.ClusterState) {
		sig := addService(st, "telco/sig", "172.30.0.10", nodePortType, ports(sctp("m3ua", 2905, 32905), udp("gtp", 2152, 32152)))
		addSlice(st, sig, "sig-1", []state.EndpointPort{
			{Name: "m3ua", Protocol: state.SCTP, Port: 2905}, {Name: "gtp", Protocol: state.UDP, Port: 2152},
		}, ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"))
		sticky := addService(st, "telco/sticky", "172.30.0.11", affinity(time.Minute), ports(sctp("m3ua", 2905, 0)))
		addSlice(st, sticky, "sticky-1", targets(sticky, 2905), ep("10.1.0.6", nodeName))
	}},
	{name: "ipv6", families: ipv6, config: func(c *Config) {
		c.NodePortAddresses = prefixes("fd00::/8", "::1/128", "192.168.0.0/24")
	}, cluster: func(st *state.ClusterState) {
		web := addService(st, "default/web", "fd02::10", loadBalancer("2001:db8::10"), sourceRanges("2001:db8:1::/48", "192.0.2.0/24"), ports(tcp("http", 80, 30080)))
		addSlice(st, web, "web-1", targets(web, 8080), ep("fd01::5", nodeName), ep("fd01:0:0:1::6", "node-b"))
		sticky := addService(st, "default/sticky", "fd02::11", etpLocal, externalIPs("2001:db8::11"), affinity(time.Hour), ports(udp("dns", 53, 30053)))
		addSlice(st, sticky, "sticky-1", targets(sticky, 5353), ep("fd01::7", nodeName), ep("fd01:0:0:1::7", "node-b"))
		addService(st, "default/empty", "fd02::12", ports(tcp("http", 80, 0)))
	}},
	{name: "dual-stack", families: dual, cluster: func(st *state.ClusterState) {
		both := addService(st, "default/both", "172.30.0.10,fd02::10", nodePortType, ports(tcp("http", 80, 30080)))
		addSlice(st, both, "both-v4", targets(both, 8080), ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"))
		addSlice(st, both, "both-v6", targets(both, 8080), ep("fd01::5", nodeName))
		v4 := addService(st, "default/v4", "172.30.0.11", ports(tcp("http", 80, 0)))
		addSlice(st, v4, "v4-1", targets(v4, 8080), ep("10.1.0.6", nodeName))
		v6 := addService(st, "default/v6", "fd02::11", ports(tcp("http", 80, 0)))
		addSlice(st, v6, "v6-1", targets(v6, 8080), ep("fd01::6", nodeName))
	}},
}

// simpleCluster has one Service of each policy, for the goldens that vary the
// configuration rather than the cluster.
func simpleCluster(st *state.ClusterState) {
	web := addService(st, "default/web", "172.30.0.10", nodePortType, ports(tcp("http", 80, 30080)))
	addSlice(st, web, "web-1", targets(web, 8080), ep("10.1.0.5", nodeName), ep("10.2.0.6", "node-b"))
	lb := addService(st, "default/lb", "172.30.0.11", loadBalancer("203.0.113.11"), etpLocal, ports(tcp("http", 80, 30081)))
	addSlice(st, lb, "lb-1", targets(lb, 8080), ep("10.1.0.7", nodeName), ep("10.2.0.7", "node-b"))
}

// input returns the cluster and the defaulted, validated configuration of g.
func (g golden) input(t testing.TB) (*state.ClusterState, Config) {
	t.Helper()
	st := newCluster()
	g.cluster(st)
	cfg := baseConfig()
	if g.config != nil {
		g.config(&cfg)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("golden %s: invalid config: %v", g.name, err)
	}
	return st, cfg
}

// dump applies Build's output for each family of g to a fresh knftables.Fake and
// returns its dump.
func (g golden) dump(t testing.TB) string {
	t.Helper()
	st, cfg := g.input(t)
	return dumpRulesets(t, cfg.Table, g.families, func(f knftables.Family) *Ruleset { return Build(st, cfg, f) })
}

// dumpRulesets applies the ruleset of each family to its own fresh knftables.Fake,
// as the proxier applies each to its own knftables.Interface, and returns the dumps
// one after the other.
func dumpRulesets(t testing.TB, table string, families []knftables.Family, build func(knftables.Family) *Ruleset) string {
	t.Helper()
	var out strings.Builder
	for _, f := range families {
		fake := knftables.NewFake(f, table)
		tx := fake.NewTransaction()
		build(f).AddTo(tx)
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatalf("family %s: applying the ruleset to knftables.Fake: %v", f, err)
		}
		out.WriteString(fake.Dump())
	}
	return out.String()
}

func goldenPath(name string) string { return filepath.Join("testdata", name+".nft") }

// TestGoldens compares Build's output for each feature with testdata/<name>.nft.
// Run with -update to rewrite the files, then review the diff like code.
func TestGoldens(t *testing.T) {
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			got := g.dump(t)
			path := goldenPath(g.name)
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("Build output differs from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

// TestGoldenFilesHaveTests catches a golden file left behind by a renamed test.
func TestGoldenFilesHaveTests(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.nft"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, g := range goldens {
		known[goldenPath(g.name)] = true
	}
	for _, f := range files {
		if !known[f] {
			t.Errorf("%s has no golden test", f)
		}
	}
}
