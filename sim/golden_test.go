package sim

import (
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/internal/testenv"
	"github.com/nftproxy/nftproxy/packet"
)

// The golden rulesets come in two forms: *.dump.nft is knftables.Fake.Dump text (what
// the proxier hands to `nft -f`), *.list.nft is what `nft list ruleset` (nft 1.0.6)
// printed after the dump was loaded into a kernel in a throwaway network namespace:
//
//	unshare -n sh -c 'nft -f x.dump.nft && nft list ruleset' > x.list.nft
//
// As root, the tests also load each dump into a fresh namespace and run every scenario
// on that listing (`nft -a list ruleset`, with handles) too; element order in listings
// varies, so it is compared by outcome, not text. *.list.json is the same listing as
// `nft -j list ruleset` prints it (CompileJSON); as root the kernel's JSON is traced too.

// want is one expected outcome of a trace, aggregated over branches.
type want struct {
	dst      string  // destination after DNAT, "addr:port"
	p        float64 // probability
	v        Verdict
	d        Delivery
	src      string // final source "addr:port" (after SNAT); "" = unchanged
	chain    string // for drop/reject: the chain that decided
	masq     bool
	rejectBy string // reject type, if any
}

func (w want) String() string {
	return fmt.Sprintf("%s p=%.4f %s %s src=%s chain=%s masq=%v reject=%q", w.dst, w.p, w.v, w.d, w.src, w.chain, w.masq, w.rejectBy)
}

// outcomes aggregates a trace's branches into wants.
func outcomes(tr *Trace) []want {
	agg := map[string]*want{}
	var keys []string
	for _, b := range tr.Branches {
		o := b.Outcome
		w := want{dst: formatAddrPort(o.Packet.Dst, o.Packet.Protocol), v: o.Verdict, d: o.Delivery, masq: o.Masquerade, rejectBy: o.Reject}
		if o.Packet.Src != tr.Packet.Src {
			w.src = formatAddrPort(o.Packet.Src, o.Packet.Protocol)
		}
		if o.Verdict != VerdictAccept {
			w.chain = o.Chain
		}
		k := w.String()
		if a, ok := agg[k]; ok {
			a.p += b.Probability
			continue
		}
		w.p = b.Probability
		agg[k] = &w
		keys = append(keys, k)
	}
	var out []want
	for _, k := range keys {
		out = append(out, *agg[k])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dst+out[i].src < out[j].dst+out[j].src })
	return out
}

func checkOutcomes(t *testing.T, tr *Trace, wants []want) {
	t.Helper()
	got := outcomes(tr)
	sort.Slice(wants, func(i, j int) bool { return wants[i].dst+wants[i].src < wants[j].dst+wants[j].src })
	ok := len(got) == len(wants)
	for i := 0; ok && i < len(got); i++ {
		g, w := got[i], wants[i]
		if w.p == 0 {
			w.p = 1
		}
		if math.Abs(g.p-w.p) > 1e-9 {
			ok = false
		}
		g.p, w.p = 0, 0
		if g != w {
			ok = false
		}
	}
	if !ok {
		var gs, ws []string
		for _, g := range got {
			gs = append(gs, g.String())
		}
		for _, w := range wants {
			if w.p == 0 {
				w.p = 1
			}
			ws = append(ws, w.String())
		}
		t.Errorf("outcomes:\n got: %s\nwant: %s\ntrace:\n%s", strings.Join(gs, "\n      "), strings.Join(ws, "\n      "), tr)
	}
	sum := 0.0
	for _, e := range tr.Endpoints() {
		sum += e.Probability
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("endpoint probabilities sum to %v", sum)
	}
}

type scenario struct {
	name  string
	pkt   string
	wants []want
}

// loadGolden compiles both forms of a golden ruleset; the dump form goes through a
// knftables.Fake (ParseDump, then CompileFake) and must be exactly what Fake.Dump
// prints.
func loadGolden(t *testing.T, name string) map[string]*Program {
	t.Helper()
	if p, ok := goldenCache.Load(name); ok {
		return p.(map[string]*Program)
	}
	progs := compileGolden(t, name)
	goldenCache.Store(name, progs)
	return progs
}

var goldenCache sync.Map // name -> map[string]*Program; programs are immutable

func compileGolden(t *testing.T, name string) map[string]*Program {
	t.Helper()
	dump, err := os.ReadFile("testdata/" + name + ".dump.nft")
	if err != nil {
		t.Fatal(err)
	}
	fake := knftables.NewFake("", "")
	if err := fake.ParseDump(string(dump)); err != nil {
		t.Fatalf("%s.dump.nft is not valid knftables.Fake dump text: %v", name, err)
	}
	if got := fake.Dump(); got != string(dump) {
		t.Fatalf("%s.dump.nft is not in Fake.Dump's canonical form; Dump() gives:\n%s", name, got)
	}
	fromFake, err := CompileFake(fake)
	if err != nil {
		t.Fatalf("CompileFake(%s): %v", name, err)
	}
	list, err := os.ReadFile("testdata/" + name + ".list.nft")
	if err != nil {
		t.Fatal(err)
	}
	fromList, err := CompileText(string(list))
	if err != nil {
		t.Fatalf("CompileText(%s.list.nft): %v", name, err)
	}
	progs := map[string]*Program{"dump": fromFake, "list": fromList}
	if listing, ok := kernelListing(t, "testdata/"+name+".dump.nft"); ok {
		fromKernel, err := CompileText(listing)
		if err != nil {
			t.Fatalf("CompileText(kernel listing of %s.dump.nft): %v", name, err)
		}
		progs["kernel"] = fromKernel
	}
	js, err := os.ReadFile("testdata/" + name + ".list.json")
	if err != nil {
		t.Fatal(err)
	}
	if progs["json"], err = CompileJSON(js, CompileOptions{}); err != nil {
		t.Fatalf("CompileJSON(%s.list.json): %v", name, err)
	}
	if listing, ok := kernelJSON(t, "testdata/"+name+".dump.nft"); ok {
		if progs["kernel-json"], err = CompileText(listing); err != nil {
			t.Fatalf("CompileText(kernel JSON listing of %s.dump.nft): %v", name, err)
		}
	}
	return progs
}

// kernelJSON is kernelListing with `nft -j list ruleset`.
func kernelJSON(t *testing.T, file string) (string, bool) {
	t.Helper()
	if _, ok := kernelListing(t, file); !ok {
		return "", false
	}
	out, err := exec.Command("unshare", "-n", "sh", "-c", `nft -f "$1" && nft -j list ruleset`, "sh", file).Output()
	if err != nil {
		t.Fatalf("nft -j list ruleset of %s: %v", file, err)
	}
	return string(out), true
}

var kernelOnce sync.Once
var kernelSkip string

// kernelListing loads an nft file into the kernel inside a throwaway network namespace
// (never the machine's own) and returns what `nft list ruleset` prints there. It
// returns false, logging why, unless the test runs as root with unshare and nft.
func kernelListing(t *testing.T, file string) (string, bool) {
	t.Helper()
	kernelOnce.Do(func() {
		switch {
		case testing.Short():
			kernelSkip = "-short"
		default:
			kernelSkip = testenv.Missing("unshare", "nft")
		}
	})
	if kernelSkip != "" {
		t.Logf("not loading %s into a kernel: %s", file, kernelSkip)
		return "", false
	}
	// -a adds "# handle N" comments, which the listing parser must skip.
	out, err := exec.Command("unshare", "-n", "sh", "-c", `nft -f "$1" && nft -a list ruleset`, "sh", file).CombinedOutput()
	if err != nil {
		t.Fatalf("the kernel rejects %s: %v\n%s", file, err, out)
	}
	return string(out), true
}

func runScenarios(t *testing.T, name string, env Env, scenarios []scenario) {
	progs := loadGolden(t, name)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var first *Trace
			for _, form := range []string{"dump", "list", "kernel", "json", "kernel-json"} {
				if progs[form] == nil {
					continue
				}
				tr, err := progs[form].Trace(packet.MustParse(sc.pkt), env)
				if err != nil {
					t.Fatalf("%s: %v", form, err)
				}
				t.Run(form, func(t *testing.T) { checkOutcomes(t, tr, sc.wants) })
				if first == nil {
					first = tr
					continue
				}
				if a, b := fmt.Sprint(outcomes(first)), fmt.Sprint(outcomes(tr)); a != b {
					t.Errorf("dump and %s forms disagree:\n dump: %s\n %s: %s", form, a, form, b)
				}
				if a, b := fmt.Sprint(first.Endpoints()), fmt.Sprint(tr.Endpoints()); a != b {
					t.Errorf("dump and %s endpoints disagree:\n dump: %s\n %s: %s", form, a, form, b)
				}
			}
		})
	}
}

var nodeEnv = Env{
	LocalAddrs: []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("fd00::2")},
	Routes: []Route{
		{Prefix: netip.MustParsePrefix("10.1.0.0/24"), Dev: "cni0"},
		{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Dev: "eth0", Src: netip.MustParseAddr("192.168.0.2")},
	},
}

const (
	A  = VerdictAccept
	Dr = VerdictDrop
	Rj = VerdictReject
	Fw = DeliveryForward
	Lo = DeliveryLocal
	Ou = DeliveryOut
	No = DeliveryNone
)

func TestGoldenNftproxy(t *testing.T) {
	runScenarios(t, "nftproxy", nodeEnv, []scenario{
		{"clusterip from pod: two endpoints, hairpin masquerades", "tcp 10.1.0.5:40000 -> 172.30.0.41:80 iif veth-a", []want{
			{dst: "10.1.0.5:8080", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
			{dst: "10.2.0.6:8080", p: 0.5, v: A, d: Fw},
		}},
		{"clusterip from outside the cluster CIDR is masqueraded", "tcp 1.2.3.4:40000 -> 172.30.0.41:80 iif eth0", []want{
			{dst: "10.1.0.5:8080", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
			{dst: "10.2.0.6:8080", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
		}},
		{"clusterip from the node itself: masqueraded to its own address", "tcp 192.168.0.2:40000 -> 172.30.0.41:80", []want{
			{dst: "10.1.0.5:8080", p: 0.5, v: A, d: Ou, masq: true},
			{dst: "10.2.0.6:8080", p: 0.5, v: A, d: Ou, masq: true},
		}},
		{"clusterip udp port not in the service", "udp 10.1.0.5:40000 -> 172.30.0.41:80 iif veth-a", []want{
			{dst: "172.30.0.41:80", v: Rj, d: No, chain: "cluster-ips-check"},
		}},
		{"clusterip wrong port is rejected", "tcp 10.1.0.5:40000 -> 172.30.0.41:81 iif veth-a", []want{
			{dst: "172.30.0.41:81", v: Rj, d: No, chain: "cluster-ips-check"},
		}},
		{"unallocated service IP is dropped", "tcp 10.1.0.5:40000 -> 172.30.9.9:80 iif veth-a", []want{
			{dst: "172.30.9.9:80", v: Dr, d: No, chain: "cluster-ips-check"},
		}},
		{"icmp to a clusterip is rejected", "icmp 10.1.0.5 -> 172.30.0.41 iif veth-a", []want{
			{dst: "172.30.0.41", v: Rj, d: No, chain: "cluster-ips-check"},
		}},
		{"externalIP of an ETP Cluster service masquerades", "tcp 1.2.3.4:40000 -> 198.51.100.20:80 iif eth0", []want{
			{dst: "10.1.0.5:8080", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
			{dst: "10.2.0.6:8080", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
		}},
		{"nodeport from outside masquerades", "tcp 1.2.3.4:40000 -> 192.168.0.2:30080 iif eth0", []want{
			{dst: "10.1.0.5:8080", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
			{dst: "10.2.0.6:8080", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
		}},
		{"port on node address that is not a nodeport goes to the node", "tcp 1.2.3.4:40000 -> 192.168.0.2:22 iif eth0", []want{
			{dst: "192.168.0.2:22", v: A, d: Lo},
		}},
		{"service without endpoints: clusterip from pod rejected", "tcp 10.1.0.5:40000 -> 172.30.0.50:80 iif veth-a", []want{
			{dst: "172.30.0.50:80", v: Rj, d: No, chain: "reject-chain"},
		}},
		{"service without endpoints: clusterip from node rejected at output", "tcp 192.168.0.2:40000 -> 172.30.0.50:80", []want{
			{dst: "172.30.0.50:80", v: Rj, d: No, chain: "reject-chain"},
		}},
		{"service without endpoints: nodeport rejected at input", "tcp 1.2.3.4:40000 -> 192.168.0.2:30050 iif eth0", []want{
			{dst: "192.168.0.2:30050", v: Rj, d: No, chain: "reject-chain"},
		}},
		{"ETP Local LB IP from an allowed source: local endpoint only, source kept", "tcp 192.0.2.5:40000 -> 203.0.113.10:80 iif eth0", []want{
			{dst: "10.1.0.7:8080", v: A, d: Fw},
		}},
		{"ETP Local LB IP from a disallowed source: firewall drops", "tcp 1.2.3.4:40000 -> 203.0.113.10:80 iif eth0", []want{
			{dst: "203.0.113.10:80", v: Dr, d: No, chain: "firewall-UNPRQAGV-ns2/local/tcp/http"},
		}},
		{"ETP Local LB IP from a single allowed address", "tcp 198.51.100.7:40000 -> 203.0.113.10:80 iif eth0", []want{
			{dst: "10.1.0.7:8080", v: A, d: Fw},
		}},
		{"ETP Local clusterIP uses all endpoints", "tcp 10.1.0.5:40000 -> 172.30.0.60:80 iif veth-a", []want{
			{dst: "10.1.0.7:8080", p: 0.5, v: A, d: Fw},
			{dst: "10.2.0.8:8080", p: 0.5, v: A, d: Fw},
		}},
		{"ETP Local nodeport from outside: local endpoint, no masquerade", "tcp 1.2.3.4:40000 -> 192.168.0.2:30060 iif eth0", []want{
			{dst: "10.1.0.7:8080", v: A, d: Fw},
		}},
		{"ETP Local nodeport from a pod: all endpoints", "tcp 10.1.0.5:40000 -> 192.168.0.2:30060 iif veth-a", []want{
			{dst: "10.1.0.7:8080", p: 0.5, v: A, d: Fw},
			{dst: "10.2.0.8:8080", p: 0.5, v: A, d: Fw},
		}},
		{"ETP Local nodeport from the node: all endpoints, masqueraded", "tcp 192.168.0.2:40000 -> 192.168.0.2:30060", []want{
			{dst: "10.1.0.7:8080", p: 0.5, v: A, d: Ou, masq: true},
			{dst: "10.2.0.8:8080", p: 0.5, v: A, d: Ou, masq: true},
		}},
		{"affinity service, first connection", "tcp 10.3.0.5:40000 -> 172.30.0.70:80 iif eth0", []want{
			{dst: "10.1.0.9:8080", p: 0.5, v: A, d: Fw},
			{dst: "10.2.0.10:8080", p: 0.5, v: A, d: Fw},
		}},
		{"established packet skips NAT", "tcp 10.1.0.5:40000 -> 172.30.0.41:80 iif veth-a ct established", []want{
			{dst: "172.30.0.41:80", v: A, d: Fw},
		}},
		{"untracked packet skips NAT and the ct state new checks", "tcp 10.1.0.5:40000 -> 172.30.0.50:80 iif veth-a ct untracked", []want{
			{dst: "172.30.0.50:80", v: A, d: Fw},
		}},
	})
}

// TestGoldenNftproxyIPv6 runs the IPv6 table of our layout (a subset: ClusterIP
// dispatch, hairpin masquerade).
func TestGoldenNftproxyIPv6(t *testing.T) {
	runScenarios(t, "nftproxy6", nodeEnv, []scenario{
		{"clusterip from pod, hairpin masquerades", "tcp [fd10::5]:40000 -> [fd30::41]:80 iif veth-a", []want{
			{dst: "[fd10::5]:8080", p: 0.5, v: A, d: Fw, src: "[fd00::2]:40000", masq: true},
			{dst: "[fd10::6]:8080", p: 0.5, v: A, d: Fw},
		}},
		{"clusterip from outside the pod prefix masquerades", "tcp [2001:db8::1]:40000 -> [fd30::41]:80 iif eth0", []want{
			{dst: "[fd10::5]:8080", p: 0.5, v: A, d: Fw, src: "[fd00::2]:40000", masq: true},
			{dst: "[fd10::6]:8080", p: 0.5, v: A, d: Fw, src: "[fd00::2]:40000", masq: true},
		}},
		{"IPv4 packets do not see the ip6 table", "tcp 10.1.0.5:40000 -> 172.30.0.41:80 iif veth-a", []want{
			{dst: "172.30.0.41:80", v: A, d: Fw},
		}},
	})
}

func TestGoldenKubeProxy(t *testing.T) {
	runScenarios(t, "kube-proxy", nodeEnv, []scenario{
		{"clusterip, two endpoints, hairpin", "tcp 10.180.0.1:40000 -> 172.30.0.41:80 iif veth-a", []want{
			{dst: "10.180.0.1:80", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
			{dst: "10.180.2.1:80", p: 0.5, v: A, d: Fw},
		}},
		{"clusterip from outside the cluster CIDR masquerades", "tcp 1.2.3.4:40000 -> 172.30.0.41:80 iif eth0", []want{
			{dst: "10.180.0.1:80", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
			{dst: "10.180.2.1:80", p: 0.5, v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
		}},
		{"nodeport goes through the external chain", "tcp 1.2.3.4:40000 -> 192.168.0.2:3001 iif eth0", []want{
			{dst: "10.180.0.2:80", v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
		}},
		{"service without endpoints", "tcp 10.180.0.1:40000 -> 172.30.0.43:80 iif veth-a", []want{
			{dst: "172.30.0.43:80", v: Rj, d: No, chain: "reject-chain"},
		}},
		{"nodeport without endpoints", "tcp 1.2.3.4:40000 -> 192.168.0.2:3003 iif eth0", []want{
			{dst: "192.168.0.2:3003", v: Rj, d: No, chain: "reject-chain"},
		}},
		{"LB IP from an allowed source", "tcp 203.0.113.5:40000 -> 5.6.7.8:80 iif eth0", []want{
			{dst: "10.180.0.4:80", v: A, d: Fw, src: "192.168.0.2:40000", masq: true},
		}},
		{"LB IP from a disallowed source", "tcp 203.0.113.200:40000 -> 5.6.7.8:80 iif eth0", []want{
			{dst: "5.6.7.8:80", v: Dr, d: No, chain: "firewall-LAUZTJTB-ns4/svc4/tcp/p80"},
		}},
		{"wrong port of a clusterip", "tcp 10.180.0.1:40000 -> 172.30.0.41:8080 iif veth-a", []want{
			{dst: "172.30.0.41:8080", v: Rj, d: No, chain: "cluster-ips-check"},
		}},
		{"unallocated clusterip", "tcp 10.180.0.1:40000 -> 172.30.1.1:80 iif veth-a", []want{
			{dst: "172.30.1.1:80", v: Dr, d: No, chain: "cluster-ips-check"},
		}},
		{"clusterip from the node", "tcp 192.168.0.2:40000 -> 172.30.0.42:80", []want{
			{dst: "10.180.0.2:80", v: A, d: Ou, masq: true},
		}},
		{"affinity service, first connection", "tcp 10.180.3.3:40000 -> 172.30.0.45:80 iif veth-a", []want{
			{dst: "10.180.0.5:80", p: 0.5, v: A, d: Fw},
			{dst: "10.180.0.6:80", p: 0.5, v: A, d: Fw},
		}},
	})
}

func TestGoldenFirewall(t *testing.T) {
	runScenarios(t, "firewall", nodeEnv, []scenario{
		{"ssh allowed", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0", []want{{dst: "192.168.0.2:22", v: A, d: Lo}}},
		{"http allowed over IPv6", "tcp [fd00::9]:5555 -> [fd00::2]:80 iif eth0", []want{{dst: "[fd00::2]:80", v: A, d: Lo}}},
		{"https dropped by policy", "tcp 1.2.3.4:5555 -> 192.168.0.2:443 iif eth0", []want{{dst: "192.168.0.2:443", v: Dr, d: No, chain: "input"}}},
		{"https over IPv6 dropped by policy", "tcp [fd00::9]:5555 -> [fd00::2]:443 iif eth0", []want{{dst: "[fd00::2]:443", v: Dr, d: No, chain: "input"}}},
		{"established https accepted", "tcp 1.2.3.4:5555 -> 192.168.0.2:443 iif eth0 ct established", []want{{dst: "192.168.0.2:443", v: A, d: Lo}}},
		{"related accepted", "udp 1.2.3.4:5555 -> 192.168.0.2:9 iif eth0 ct related", []want{{dst: "192.168.0.2:9", v: A, d: Lo}}},
		{"invalid dropped", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0 ct invalid", []want{{dst: "192.168.0.2:22", v: Dr, d: No, chain: "input"}}},
		{"telnet reset", "tcp 1.2.3.4:5555 -> 192.168.0.2:23 iif eth0", []want{{dst: "192.168.0.2:23", v: Rj, d: No, chain: "input", rejectBy: "tcp reset"}}},
		{"blocklisted prefix", "tcp 203.0.113.9:5555 -> 192.168.0.2:22 iif eth0", []want{{dst: "192.168.0.2:22", v: Dr, d: No, chain: "input"}}},
		{"blocklisted address", "tcp 198.51.100.7:5555 -> 192.168.0.2:22 iif eth0", []want{{dst: "192.168.0.2:22", v: Dr, d: No, chain: "input"}}},
		{"neighbour of a blocklisted address", "tcp 198.51.100.8:5555 -> 192.168.0.2:22 iif eth0", []want{{dst: "192.168.0.2:22", v: A, d: Lo}}},
		{"loopback interface accepted", "tcp 127.0.0.1:5555 -> 127.0.0.1:9999 iif lo", []want{{dst: "127.0.0.1:9999", v: A, d: Lo}}},
		{"node to itself loops back through lo", "tcp 192.168.0.2:5555 -> 192.168.0.2:9999", []want{{dst: "192.168.0.2:9999", v: A, d: Lo}}},
		{"dns from the cluster", "udp 10.9.9.9:5353 -> 192.168.0.2:53 iif eth0", []want{{dst: "192.168.0.2:53", v: A, d: Lo}}},
		{"dns from elsewhere", "udp 1.2.3.4:5353 -> 192.168.0.2:53 iif eth0", []want{{dst: "192.168.0.2:53", v: Dr, d: No, chain: "input"}}},
		{"ping", "icmp 1.2.3.4 -> 192.168.0.2 iif eth0", []want{{dst: "192.168.0.2", v: A, d: Lo}}},
		{"ping6", "icmpv6 fd00::9 -> fd00::2 iif eth0", []want{{dst: "fd00::2", v: A, d: Lo}}},
		{"forward dropped", "tcp 1.2.3.4:5555 -> 8.8.8.8:53 iif eth0", []want{{dst: "8.8.8.8:53", v: Dr, d: No, chain: "forward"}}},
		{"established forward accepted", "tcp 1.2.3.4:5555 -> 8.8.8.8:53 iif eth0 ct established", []want{{dst: "8.8.8.8:53", v: A, d: Fw}}},
		{"output with mark 1 dropped", "tcp 192.168.0.2:5555 -> 8.8.8.8:53 mark 0x1", []want{{dst: "8.8.8.8:53", v: Dr, d: No, chain: "output"}}},
		{"output accepted", "tcp 192.168.0.2:5555 -> 8.8.8.8:53", []want{{dst: "8.8.8.8:53", v: A, d: Ou}}},
	})
}

// TestAffinity follows sessionAffinity in both layouts: the first connection from a
// client picks an endpoint at random and records the client in that endpoint's
// affinity set; later connections go to the same endpoint until the set element times
// out.
func TestAffinity(t *testing.T) {
	cases := []struct {
		golden, pkt, pkt2, want, other, set string
	}{
		{"nftproxy", "tcp 10.3.0.5:40000 -> 172.30.0.70:80 iif eth0", "tcp 10.3.0.5:40001 -> 172.30.0.70:80 iif eth0",
			"10.2.0.10:8080", "10.1.0.9:8080", "affinity-ep-H7VLHSSA-ns3/sticky/tcp/80__10.2.0.10/8080"},
		{"kube-proxy", "tcp 10.180.3.3:40000 -> 172.30.0.45:80 iif veth-a", "tcp 10.180.3.3:40001 -> 172.30.0.45:80 iif veth-a",
			"10.180.0.6:80", "10.180.0.5:80", "affinity-WLGLN4N3-ns5/svc5/tcp/p80__10.180.0.6/80"},
	}
	for _, tc := range cases {
		for form, prog := range loadGolden(t, tc.golden) {
			t.Run(tc.golden+"/"+form, func(t *testing.T) {
				clock := NewManualClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
				env := nodeEnv
				env.Clock = clock
				env.Select = func(tr *Trace) int {
					for i, b := range tr.Branches {
						if b.Outcome.Packet.Dst.String() == tc.want {
							return i
						}
					}
					t.Fatalf("no branch to %s in\n%s", tc.want, tr)
					return 0
				}
				rt := NewRuntime(prog, env)
				tr, err := rt.Trace(packet.MustParse(tc.pkt))
				if err != nil {
					t.Fatal(err)
				}
				if len(tr.Branches) != 2 || tr.Branches[tr.Committed].Outcome.Packet.Dst.String() != tc.want {
					t.Fatalf("first connection: want 2 branches, committed %s:\n%s", tc.want, tr)
				}
				table := "ip " + tc.golden
				if got := rt.SetElements(table, tc.set); len(got) != 1 || got[0] != packet.MustParse(tc.pkt).Src.Addr().String() {
					t.Fatalf("affinity set %s = %v", tc.set, got)
				}
				clock.Advance(2 * time.Hour)
				tr, err = rt.Trace(packet.MustParse(tc.pkt2))
				if err != nil {
					t.Fatal(err)
				}
				checkOutcomes(t, tr, []want{{dst: tc.want, v: A, d: Fw}})
				// The second connection refreshed the element: 3h after it, still sticky.
				clock.Advance(3*time.Hour - time.Second)
				tr, _ = rt.Trace(packet.MustParse(strings.Replace(tc.pkt2, "40001", "40002", 1)))
				checkOutcomes(t, tr, []want{{dst: tc.want, v: A, d: Fw}})
				// Without traffic for the set's 3h timeout, the client is free again.
				clock.Advance(3*time.Hour + time.Second)
				if got := rt.SetElements(table, tc.set); len(got) != 0 {
					t.Fatalf("affinity set after timeout = %v", got)
				}
				tr, _ = rt.Trace(packet.MustParse(strings.Replace(tc.pkt2, "40001", "40003", 1)))
				checkOutcomes(t, tr, []want{{dst: tc.want, p: 0.5, v: A, d: Fw}, {dst: tc.other, p: 0.5, v: A, d: Fw}})
			})
		}
	}
}

// TestConntrackFlow sends the first packet, a later packet and a reply of one
// connection through a Runtime: only the first runs the nat chains; the others are
// translated by the conntrack entry.
func TestConntrackFlow(t *testing.T) {
	for form, prog := range loadGolden(t, "nftproxy") {
		t.Run(form, func(t *testing.T) {
			env := nodeEnv
			env.Seed = 1
			env.Select = func(tr *Trace) int {
				for i, b := range tr.Branches {
					if b.Outcome.Packet.Dst.String() == "10.1.0.5:8080" {
						return i
					}
				}
				return 0
			}
			rt := NewRuntime(prog, env)
			first := "tcp 1.2.3.4:40000 -> 172.30.0.41:80 iif eth0"
			if _, err := rt.Trace(packet.MustParse(first)); err != nil {
				t.Fatal(err)
			}
			conns := rt.Conns()
			if len(conns) != 1 || conns[0].Reply.Src.String() != "10.1.0.5:8080" || conns[0].Reply.Dst.String() != "192.168.0.2:40000" || !conns[0].Masquerade {
				t.Fatalf("conntrack = %v", conns)
			}
			// The same tuple again is part of the connection, whatever it claims.
			tr, err := rt.Trace(packet.MustParse(first))
			if err != nil {
				t.Fatal(err)
			}
			checkOutcomes(t, tr, []want{{dst: "10.1.0.5:8080", v: A, d: Fw, src: "192.168.0.2:40000", masq: true}})
			for _, s := range tr.Branches[0].Steps {
				if s.Kind == StepChain && s.Chain == "nat-prerouting" {
					t.Errorf("nat chain ran for an established packet:\n%s", tr)
				}
			}
			// The reply is translated back.
			tr, err = rt.Trace(packet.MustParse("tcp 10.1.0.5:8080 -> 192.168.0.2:40000 iif cni0"))
			if err != nil {
				t.Fatal(err)
			}
			o := tr.Branches[0].Outcome
			if o.Verdict != A || o.Delivery != Fw || o.Packet.Src.String() != "172.30.0.41:80" || o.Packet.Dst.String() != "1.2.3.4:40000" {
				t.Fatalf("reply: %+v\n%s", o, tr)
			}
			if o.Packet.OIf != "eth0" {
				t.Errorf("reply leaves via %q, want eth0 (default route)", o.Packet.OIf)
			}
			rt.FlushConntrack()
			if len(rt.Conns()) != 0 {
				t.Fatal("FlushConntrack left entries")
			}
		})
	}
}

// TestSeededCommitIsRepeatable checks that, without Select, the committed branches
// follow from Env.Seed and spread over the endpoints.
func TestSeededCommitIsRepeatable(t *testing.T) {
	prog := loadGolden(t, "nftproxy")["dump"]
	picks := func(seed uint64) []int {
		env := nodeEnv
		env.Seed = seed
		rt := NewRuntime(prog, env)
		var out []int
		for i := 0; i < 40; i++ {
			tr, err := rt.Trace(packet.MustParse(fmt.Sprintf("tcp 10.1.0.5:%d -> 172.30.0.41:80 iif veth-a", 20000+i)))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tr.Committed)
		}
		return out
	}
	a, b := picks(7), picks(7)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("same seed, different commits: %v vs %v", a, b)
	}
	counts := map[int]int{}
	for _, x := range a {
		counts[x]++
	}
	if counts[0] < 8 || counts[1] < 8 {
		t.Errorf("commits not spread over both branches: %v", counts)
	}
	if fmt.Sprint(picks(8)) == fmt.Sprint(a) {
		t.Errorf("different seeds gave the same 40 commits")
	}
}
