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
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
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
		web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080),
			fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"), fixture.Endpoint("10.3.0.7", "node-c"), fixture.Endpoint("10.3.0.8", "node-c", fixture.NotReady))
		fixture.AddSlice(st, web, "web-v6", fixture.Targets(web, 8080), fixture.Endpoint("fd01::5", fixture.NodeName))
		// An unnamed port is named by its number; a second Service with the same
		// endpoint count shares dnat-1.
		api := fixture.AddService(st, "kube-system/api", "172.30.0.1", fixture.Ports(fixture.TCP("", 443, 0)))
		fixture.AddSlice(st, api, "api-1", fixture.Targets(api, 6443), fixture.Endpoint("192.168.0.10", fixture.NodeName))
		dns := fixture.AddService(st, "kube-system/dns", "172.30.0.53", fixture.Ports(fixture.UDP("dns", 53, 0), fixture.TCP("dns-tcp", 53, 0)))
		fixture.AddSlice(st, dns, "dns-1", fixture.Targets(dns, 5353), fixture.Endpoint("10.2.0.9", "node-b"))
	}},
	{name: "clusterip-no-endpoints", families: ipv4, cluster: func(st *state.ClusterState) {
		fixture.AddService(st, "default/empty", "172.30.0.20", fixture.Ports(fixture.TCP("http", 80, 0)))
		unready := fixture.AddService(st, "default/unready", "172.30.0.21", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, unready, "unready-1", fixture.Targets(unready, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName, fixture.NotReady))
		// A Service with a ClusterIP of the other family only is not in this table.
		fixture.AddService(st, "default/v6only", "fd02::20", fixture.Ports(fixture.TCP("http", 80, 0)))
	}},
	{name: "nodeport", families: ipv4, config: func(c *Config) {
		// 10.10.0.10 is outside these prefixes; 127.0.0.1 is inside but loopback
		// never serves node ports.
		c.NodePortAddresses = fixture.Prefixes("192.168.0.0/24", "127.0.0.0/8", "fd00::/8")
	}, cluster: func(st *state.ClusterState) {
		web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.NodePortType, fixture.Ports(fixture.TCP("http", 80, 30080), fixture.UDP("syslog", 514, 30514)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
		fixture.AddService(st, "default/empty", "172.30.0.11", fixture.NodePortType, fixture.Ports(fixture.TCP("http", 80, 30081)))
	}},
	{name: "nodeport-primary", families: dual, config: func(c *Config) {
		// nodePortAddresses: [primary]: only the node's primary IP of each family
		// serves node ports, not its other addresses.
		c.NodePortPrimary = true
	}, cluster: func(st *state.ClusterState) {
		// The Node lists 10.10.0.10 as its first InternalIP; it has no IPv6 primary
		// IP of its own, so its first IPv6 address is.
		st.Node.PrimaryIPs = fixture.Addrs("10.10.0.10")
		web := fixture.AddService(st, "default/web", "172.30.0.10,fd02::10", fixture.NodePortType, fixture.Ports(fixture.TCP("http", 80, 30080)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName))
		fixture.AddSlice(st, web, "web-v6", fixture.Targets(web, 8080), fixture.Endpoint("fd01::5", fixture.NodeName))
	}},
	{name: "loadbalancer", families: ipv4, cluster: func(st *state.ClusterState) {
		web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.LoadBalancer("203.0.113.10", "2001:db8::10"), fixture.Ports(fixture.TCP("https", 443, 30443)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8443), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
		fixture.AddService(st, "default/empty", "172.30.0.11", fixture.LoadBalancer("203.0.113.11"), fixture.Ports(fixture.TCP("https", 443, 30444)))
	}},
	{name: "externalips", families: ipv4, cluster: func(st *state.ClusterState) {
		web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.ExternalIPs("198.51.100.20", "198.51.100.21"), fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"), fixture.Endpoint("10.3.0.7", "node-c"))
		fixture.AddService(st, "default/empty", "172.30.0.11", fixture.ExternalIPs("198.51.100.22"), fixture.Ports(fixture.TCP("http", 80, 0)))
		// This ExternalIP is another Service's ClusterIP, and the second one is
		// taken by default/web, first in name order: neither goes to default/web-copy.
		cp := fixture.AddService(st, "default/web-copy", "172.30.0.12", fixture.ExternalIPs("172.30.0.10", "198.51.100.20"), fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, cp, "web-copy-1", fixture.Targets(cp, 9090), fixture.Endpoint("10.9.0.9", "node-b"))
	}},
	{name: "etp-local", families: ipv4, cluster: func(st *state.ClusterState) {
		// With a local endpoint: external traffic goes to it alone, pod and node
		// traffic to all three.
		web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.LoadBalancer("203.0.113.10"), fixture.ExternalIPs("198.51.100.20"), fixture.ETPLocal, fixture.Ports(fixture.TCP("http", 80, 30080)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"), fixture.Endpoint("10.3.0.7", "node-c"))
		// Without one: external traffic is dropped, pod and node traffic still
		// reaches both remote endpoints.
		remote := fixture.AddService(st, "default/remote", "172.30.0.11", fixture.LoadBalancer("203.0.113.11"), fixture.ETPLocal, fixture.Ports(fixture.TCP("http", 80, 30081)))
		fixture.AddSlice(st, remote, "remote-1", fixture.Targets(remote, 8080), fixture.Endpoint("10.2.0.7", "node-b"), fixture.Endpoint("10.3.0.8", "node-c"))
		// Without any endpoint: rejected like any Service.
		fixture.AddService(st, "default/empty", "172.30.0.12", fixture.LoadBalancer("203.0.113.12"), fixture.ETPLocal, fixture.Ports(fixture.TCP("http", 80, 30082)))
	}},
	{name: "itp-local", families: ipv4, cluster: func(st *state.ClusterState) {
		local := fixture.AddService(st, "default/local", "172.30.0.10", fixture.ITPLocal, fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, local, "local-1", fixture.Targets(local, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.1.0.6", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
		remote := fixture.AddService(st, "default/remote", "172.30.0.11", fixture.ITPLocal, fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, remote, "remote-1", fixture.Targets(remote, 8080), fixture.Endpoint("10.2.0.7", "node-b"))
		fixture.AddService(st, "default/empty", "172.30.0.12", fixture.ITPLocal, fixture.Ports(fixture.TCP("http", 80, 0)))
		// internalTrafficPolicy leaves node ports alone: they use all endpoints.
		np := fixture.AddService(st, "default/np", "172.30.0.13", fixture.ITPLocal, fixture.NodePortType, fixture.Ports(fixture.TCP("http", 80, 30080)))
		fixture.AddSlice(st, np, "np-1", fixture.Targets(np, 8080), fixture.Endpoint("10.2.0.8", "node-b"))
	}},
	{name: "affinity", families: ipv4, cluster: func(st *state.ClusterState) {
		web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.NodePortType, fixture.Affinity(3*time.Hour), fixture.Ports(fixture.TCP("http", 80, 30080)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
		// Under externalTrafficPolicy Local, external traffic uses affinity-local,
		// whose endpoint chains and sets are the cluster chain's.
		lb := fixture.AddService(st, "default/lb", "172.30.0.11", fixture.LoadBalancer("203.0.113.11"), fixture.ETPLocal, fixture.Affinity(90*time.Second), fixture.Ports(fixture.UDP("dns", 53, 30053)))
		fixture.AddSlice(st, lb, "lb-1", fixture.Targets(lb, 5353), fixture.Endpoint("10.1.0.7", fixture.NodeName), fixture.Endpoint("10.2.0.7", "node-b"), fixture.Endpoint("10.3.0.7", "node-c"))
	}},
	{name: "source-ranges", families: ipv4, cluster: func(st *state.ClusterState) {
		// Only the LoadBalancer IP is firewalled: not the ExternalIP, not the node
		// port. The IPv6 range is another family's; the overlapping ones merge.
		web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.LoadBalancer("203.0.113.10"), fixture.ExternalIPs("198.51.100.20"),
			fixture.SourceRanges("192.0.2.0/24", "192.0.2.128/25", "198.51.100.7/32", "2001:db8::/32"), fixture.Ports(fixture.TCP("http", 80, 30080)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName))
		// Ranges of the other family only: every IPv4 source is dropped.
		v6src := fixture.AddService(st, "default/v6src", "172.30.0.11", fixture.LoadBalancer("203.0.113.11"), fixture.SourceRanges("2001:db8::/32"), fixture.Ports(fixture.TCP("http", 80, 30081)))
		fixture.AddSlice(st, v6src, "v6src-1", fixture.Targets(v6src, 8080), fixture.Endpoint("10.1.0.6", fixture.NodeName))
		// A range holds the node's primary IP (192.168.0.10): as kube-proxy, each of
		// the Service's LB IPs is an allowed source of each of its LB frontends
		// (203.0.113.13 merges with its own range).
		admin := fixture.AddService(st, "default/admin", "172.30.0.12", fixture.LoadBalancer("203.0.113.12", "203.0.113.13"),
			fixture.SourceRanges("192.168.0.0/24", "203.0.113.13/32"), fixture.Ports(fixture.TCP("https", 443, 30443)))
		fixture.AddSlice(st, admin, "admin-1", fixture.Targets(admin, 8443), fixture.Endpoint("10.1.0.7", fixture.NodeName))
		// A range holds only another node address (10.10.0.10): the LB IPs are not
		// allowed.
		other := fixture.AddService(st, "default/other", "172.30.0.13", fixture.LoadBalancer("203.0.113.14", "203.0.113.15"),
			fixture.SourceRanges("10.10.0.0/16"), fixture.Ports(fixture.TCP("https", 443, 30444)))
		fixture.AddSlice(st, other, "other-1", fixture.Targets(other, 8443), fixture.Endpoint("10.1.0.8", fixture.NodeName))
	}},
	{name: "masquerade-all", families: ipv4, config: func(c *Config) {
		c.MasqueradeAll = true
		c.MasqueradeBit = 5
	}, cluster: simpleCluster},
	{name: "interface-prefix", families: ipv4, config: func(c *Config) {
		c.LocalMode = LocalInterfacePrefix
		c.InterfacePrefix = "veth"
	}, cluster: simpleCluster},
	{name: "bridge-interface", families: ipv4, config: func(c *Config) {
		// Pod traffic is what arrives on the pods' bridge: that exact name, not a
		// prefix.
		c.LocalMode = LocalBridgeInterface
		c.BridgeInterface = "cbr0"
		c.ClusterCIDRs = nil
	}, cluster: simpleCluster},
	{name: "node-cidr", families: dual, config: func(c *Config) {
		c.LocalMode = LocalNodeCIDR
		c.ClusterCIDRs = nil
	}, cluster: func(st *state.ClusterState) {
		// Pod traffic is from the Node's own pod range, not the cluster's; the Node
		// has no IPv6 pod range yet, so the ip6 table has no detector.
		st.Node.PodCIDRs = fixture.Prefixes("10.1.0.0/24")
		simpleCluster(st)
	}},
	{name: "no-detector", families: ipv4, config: func(c *Config) {
		c.LocalMode = LocalNone
		c.ClusterCIDRs = nil
		c.ServiceCIDRs = nil
		c.Table = "proxy-test"
	}, cluster: simpleCluster},
	{name: "terminating", families: ipv4, cluster: func(st *state.ClusterState) {
		// No ready endpoint: the serving terminating ones take the traffic, the
		// not-serving one never does.
		web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.ETPLocal, fixture.LoadBalancer("203.0.113.10"), fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080),
			fixture.Endpoint("10.1.0.5", fixture.NodeName, fixture.Terminating(true)), fixture.Endpoint("10.2.0.6", "node-b", fixture.Terminating(true)), fixture.Endpoint("10.3.0.7", "node-c", fixture.Terminating(false)))
		// A ready endpoint elsewhere: the local terminating one still serves
		// external traffic, since this node has no ready one.
		mixed := fixture.AddService(st, "default/mixed", "172.30.0.11", fixture.ETPLocal, fixture.LoadBalancer("203.0.113.11"), fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, mixed, "mixed-1", fixture.Targets(mixed, 8080), fixture.Endpoint("10.1.0.8", fixture.NodeName, fixture.Terminating(true)), fixture.Endpoint("10.2.0.8", "node-b"))
		gone := fixture.AddService(st, "default/gone", "172.30.0.12", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, gone, "gone-1", fixture.Targets(gone, 8080), fixture.Endpoint("10.1.0.9", fixture.NodeName, fixture.Terminating(false)))
	}},
	{name: "topology", families: ipv4, cluster: func(st *state.ClusterState) {
		// Every ready endpoint has hints and one names zone-a: only it is used.
		hinted := fixture.AddService(st, "default/hinted", "172.30.0.10", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, hinted, "hinted-1", fixture.Targets(hinted, 8080),
			fixture.Endpoint("10.1.0.5", fixture.NodeName, fixture.Zone("zone-a"), fixture.Hints("zone-a")),
			fixture.Endpoint("10.2.0.6", "node-b", fixture.Zone("zone-b"), fixture.Hints("zone-b")),
			fixture.Endpoint("10.3.0.7", "node-c", fixture.Zone("zone-b"), fixture.Hints("zone-b")))
		// One ready endpoint without hints: hints are ignored.
		partial := fixture.AddService(st, "default/partial", "172.30.0.11", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, partial, "partial-1", fixture.Targets(partial, 8080),
			fixture.Endpoint("10.1.0.6", fixture.NodeName, fixture.Zone("zone-a"), fixture.Hints("zone-a")),
			fixture.Endpoint("10.2.0.7", "node-b", fixture.Zone("zone-b")))
		// trafficDistribution PreferSameNode: node hints name this node, so only its
		// endpoint is used, not the other one of its zone.
		same := fixture.AddService(st, "default/same-node", "172.30.0.12", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, same, "same-node-1", fixture.Targets(same, 8080),
			fixture.Endpoint("10.1.0.8", fixture.NodeName, fixture.Zone("zone-a"), fixture.Hints("zone-a"), fixture.NodeHints(fixture.NodeName)),
			fixture.Endpoint("10.3.0.8", "node-c", fixture.Zone("zone-a"), fixture.Hints("zone-a"), fixture.NodeHints("node-c")),
			fixture.Endpoint("10.2.0.8", "node-b", fixture.Zone("zone-b"), fixture.Hints("zone-b"), fixture.NodeHints("node-b")))
		// No endpoint for this node: its zone's endpoints.
		zone := fixture.AddService(st, "default/same-zone", "172.30.0.13", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, zone, "same-zone-1", fixture.Targets(zone, 8080),
			fixture.Endpoint("10.3.0.9", "node-c", fixture.Zone("zone-a"), fixture.Hints("zone-a"), fixture.NodeHints("node-c")),
			fixture.Endpoint("10.2.0.9", "node-b", fixture.Zone("zone-b"), fixture.Hints("zone-b"), fixture.NodeHints("node-b")))
	}},
	{name: "service-cidrs", families: dual, cluster: func(st *state.ClusterState) {
		// The ServiceCIDR objects' ranges join the configured ones (172.30.0.0/16,
		// fd02::/112) in the drop of unallocated addresses; one inside a configured
		// range merges into it.
		st.ServiceCIDRs = fixture.Prefixes("172.30.128.0/17", "172.31.0.0/16", "fd03::/112")
		web := fixture.AddService(st, "default/web", "172.31.0.10", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName))
	}},
	{name: "service-cidrs-only", families: dual, config: func(c *Config) { c.ServiceCIDRs = nil }, cluster: func(st *state.ClusterState) {
		// Without a configured serviceCIDR, the objects' ranges alone; the ip6 table
		// has none, so no drop.
		st.ServiceCIDRs = fixture.Prefixes("172.31.0.0/16")
	}},
	{name: "sctp-udp", families: ipv4, cluster: func(st *state.ClusterState) {
		sig := fixture.AddService(st, "telco/sig", "172.30.0.10", fixture.NodePortType, fixture.Ports(fixture.SCTP("m3ua", 2905, 32905), fixture.UDP("gtp", 2152, 32152)))
		fixture.AddSlice(st, sig, "sig-1", []state.EndpointPort{
			{Name: "m3ua", Protocol: state.SCTP, Port: 2905}, {Name: "gtp", Protocol: state.UDP, Port: 2152},
		}, fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
		sticky := fixture.AddService(st, "telco/sticky", "172.30.0.11", fixture.Affinity(time.Minute), fixture.Ports(fixture.SCTP("m3ua", 2905, 0)))
		fixture.AddSlice(st, sticky, "sticky-1", fixture.Targets(sticky, 2905), fixture.Endpoint("10.1.0.6", fixture.NodeName))
	}},
	{name: "ipv6", families: ipv6, config: func(c *Config) {
		c.NodePortAddresses = fixture.Prefixes("fd00::/8", "::1/128", "192.168.0.0/24")
	}, cluster: func(st *state.ClusterState) {
		web := fixture.AddService(st, "default/web", "fd02::10", fixture.LoadBalancer("2001:db8::10"), fixture.SourceRanges("2001:db8:1::/48", "192.0.2.0/24"), fixture.Ports(fixture.TCP("http", 80, 30080)))
		fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("fd01::5", fixture.NodeName), fixture.Endpoint("fd01:0:0:1::6", "node-b"))
		sticky := fixture.AddService(st, "default/sticky", "fd02::11", fixture.ETPLocal, fixture.ExternalIPs("2001:db8::11"), fixture.Affinity(time.Hour), fixture.Ports(fixture.UDP("dns", 53, 30053)))
		fixture.AddSlice(st, sticky, "sticky-1", fixture.Targets(sticky, 5353), fixture.Endpoint("fd01::7", fixture.NodeName), fixture.Endpoint("fd01:0:0:1::7", "node-b"))
		fixture.AddService(st, "default/empty", "fd02::12", fixture.Ports(fixture.TCP("http", 80, 0)))
	}},
	{name: "dual-stack", families: dual, cluster: func(st *state.ClusterState) {
		both := fixture.AddService(st, "default/both", "172.30.0.10,fd02::10", fixture.NodePortType, fixture.Ports(fixture.TCP("http", 80, 30080)))
		fixture.AddSlice(st, both, "both-v4", fixture.Targets(both, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
		fixture.AddSlice(st, both, "both-v6", fixture.Targets(both, 8080), fixture.Endpoint("fd01::5", fixture.NodeName))
		v4 := fixture.AddService(st, "default/v4", "172.30.0.11", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, v4, "v4-1", fixture.Targets(v4, 8080), fixture.Endpoint("10.1.0.6", fixture.NodeName))
		v6 := fixture.AddService(st, "default/v6", "fd02::11", fixture.Ports(fixture.TCP("http", 80, 0)))
		fixture.AddSlice(st, v6, "v6-1", fixture.Targets(v6, 8080), fixture.Endpoint("fd01::6", fixture.NodeName))
	}},
}

// simpleCluster has one Service of each policy, for the goldens that vary the
// configuration rather than the cluster.
func simpleCluster(st *state.ClusterState) {
	web := fixture.AddService(st, "default/web", "172.30.0.10", fixture.NodePortType, fixture.Ports(fixture.TCP("http", 80, 30080)))
	fixture.AddSlice(st, web, "web-1", fixture.Targets(web, 8080), fixture.Endpoint("10.1.0.5", fixture.NodeName), fixture.Endpoint("10.2.0.6", "node-b"))
	lb := fixture.AddService(st, "default/lb", "172.30.0.11", fixture.LoadBalancer("203.0.113.11"), fixture.ETPLocal, fixture.Ports(fixture.TCP("http", 80, 30081)))
	fixture.AddSlice(st, lb, "lb-1", fixture.Targets(lb, 8080), fixture.Endpoint("10.1.0.7", fixture.NodeName), fixture.Endpoint("10.2.0.7", "node-b"))
}

// input returns the cluster and the defaulted, validated configuration of g.
func (g golden) input(t testing.TB) (*state.ClusterState, Config) {
	t.Helper()
	st := fixture.NewCluster()
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
