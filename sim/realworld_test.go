package sim

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testenv"
	"github.com/nftproxy/nftproxy/packet"
)

// Real nodes' rulesets, as nft 1.0.6 lists them: firewalld's (testdata/firewalld.list.nft,
// the public zone with ssh, dhcpv6-client, cockpit and ftp, an icmp block, a port
// forward, masquerade, a rate-limited rich rule and MSS clamping) and iptables-nft's
// (testdata/iptables-nft.list.nft, what testdata/iptables-nft.sh's Docker and
// kube-proxy iptables-mode rules list as).

// realEnv is the node of the real-world fixtures: eth0 to the world (IPv4 and IPv6),
// cni0 to the pods, docker0 to Docker's containers.
var realEnv = Env{
	LocalAddrs: []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("fd00::2")},
	Routes: []Route{
		{Prefix: netip.MustParsePrefix("10.1.0.0/24"), Dev: "cni0"},
		{Prefix: netip.MustParsePrefix("172.17.0.0/16"), Dev: "docker0"},
		{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Dev: "eth0", Src: netip.MustParseAddr("192.168.0.2")},
		{Prefix: netip.MustParsePrefix("fd00::/64"), Dev: "eth0"},
	},
}

// summary renders a trace's outcomes, one line per endpoint: "[assumptions] p verdict
// delivery dst [masq]", sorted.
func summary(tr *Trace) []string {
	type key struct{ asm, s string }
	sum := map[key]float64{}
	for _, b := range tr.Branches {
		o := b.Outcome
		s := fmt.Sprintf("%s %s %s", o.Verdict, o.Delivery, formatAddrPort(o.Packet.Dst, o.Packet.Protocol))
		switch {
		case o.Verdict != VerdictAccept:
			s += " at " + o.Chain
		case o.Masquerade:
			s += " masq"
		}
		sum[key{strings.Join(b.Assumptions(), "; "), s}] += b.Probability
	}
	var out []string
	for k, p := range sum {
		line := fmt.Sprintf("%s %s", formatProb(p), k.s)
		if k.asm != "" {
			line = "[" + k.asm + "] " + line
		}
		out = append(out, line)
	}
	sort.Strings(out)
	return out
}

type realCase struct {
	name, pkt string
	want      []string
}

func runReal(t *testing.T, progs map[string]*Program, cases []realCase) {
	t.Helper()
	runRealEnv(t, progs, realEnv, cases)
}

// runRealEnv traces each case's packet on env through every form of the program and
// compares the summaries.
func runRealEnv(t *testing.T, progs map[string]*Program, env Env, cases []realCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for form, p := range progs {
				tr, err := p.Trace(packet.MustParse(tc.pkt), env)
				if err != nil {
					t.Fatalf("%s: %v", form, err)
				}
				want := append([]string(nil), tc.want...)
				sort.Strings(want)
				if got := summary(tr); strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Errorf("%s form:\n got: %s\nwant: %s\n%s", form, strings.Join(got, "\n      "), strings.Join(want, "\n      "), tr)
				}
			}
		})
	}
}

// compileReal compiles a fixture with forks; by default it must be a compile error
// naming the first construct a packet cannot decide.
func compileReal(t *testing.T, name, firstUndecided string) *Program {
	t.Helper()
	src, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	_, err = CompileText(string(src))
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.Contains(ce.RuleText, firstUndecided) || !strings.Contains(ce.Msg, "which a packet cannot show") {
		t.Errorf("strict CompileText(%s) = %v, want an error on %q", name, err, firstUndecided)
	}
	p, err := CompileTextOptions(string(src), CompileOptions{Forks: true})
	if err != nil {
		t.Fatalf("CompileTextOptions(%s, Forks): %v", name, err)
	}
	return p
}

func TestFirewalld(t *testing.T) {
	progs := map[string]*Program{
		"list": compileReal(t, "firewalld.list.nft", "limit rate 10/minute"),
		// The same listing as nft -j prints it.
		"json": compileReal(t, "firewalld.list.json", "limit rate 10/minute"),
	}
	if listing, ok := kernelListing(t, "testdata/firewalld.list.nft"); ok {
		p, err := CompileTextOptions(listing, CompileOptions{Forks: true})
		if err != nil {
			t.Fatalf("the kernel's listing: %v", err)
		}
		progs["kernel"] = p
	}
	if listing, ok := kernelJSON(t, "testdata/firewalld.list.nft"); ok {
		p, err := CompileTextOptions(listing, CompileOptions{Forks: true})
		if err != nil {
			t.Fatalf("the kernel's JSON listing: %v", err)
		}
		progs["kernel-json"] = p
	}
	runReal(t, progs, []realCase{
		{"ssh", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0", []string{"1 accept local 192.168.0.2:22"}},
		{"https rejected", "tcp 1.2.3.4:5555 -> 192.168.0.2:443 iif eth0", []string{"1 reject none 192.168.0.2:443 at filter_INPUT"}},
		{"established https", "tcp 1.2.3.4:5555 -> 192.168.0.2:443 iif eth0 ct established", []string{"1 accept local 192.168.0.2:443"}},
		{"invalid dropped", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0 ct invalid", []string{"1 drop none 192.168.0.2:22 at filter_INPUT"}},
		{"rate-limited rich rule", "tcp 198.51.100.7:5555 -> 192.168.0.2:8080 iif eth0", []string{
			"[under limit rate 10/minute] 1 accept local 192.168.0.2:8080",
			"[over limit rate 10/minute] 1 reject none 192.168.0.2:8080 at filter_INPUT",
		}},
		{"the rich rule's port from elsewhere", "tcp 1.2.3.4:5555 -> 192.168.0.2:8080 iif eth0", []string{"1 reject none 192.168.0.2:8080 at filter_INPUT"}},
		{"SYN from a denied prefix", "tcp 203.0.113.9:5555 -> 192.168.0.2:22 iif eth0", []string{"1 drop none 192.168.0.2:22 at filter_IN_public_deny"}},
		{"established from a denied prefix", "tcp 203.0.113.9:5555 -> 192.168.0.2:22 iif eth0 ct established", []string{"1 accept local 192.168.0.2:22"}},
		{"ping", "icmp 1.2.3.4 -> 192.168.0.2 iif eth0", []string{"1 accept local 192.168.0.2"}},
		{"ping6", "icmpv6 fd00::9 -> fd00::2 iif eth0", []string{"1 accept local fd00::2"}},
		{"router advertisement from a link-local router, before the reverse path check", "icmpv6 fe80::1 -> ff02::1 iif eth0 type nd-router-advert", []string{"1 accept local ff02::1"}},
		{"other link-local traffic fails the reverse path check", "icmpv6 fe80::1 -> fd00::2 iif eth0 type nd-redirect", []string{"1 drop none fd00::2 at raw_PREROUTING"}},
		{"icmp timestamp blocked", "icmp 1.2.3.4 -> 192.168.0.2 iif eth0 type timestamp-request", []string{"1 reject none 192.168.0.2 at filter_IN_public_deny"}},
		{"RST from a denied prefix is not a SYN", "tcp 203.0.113.9:5555 -> 192.168.0.2:22 iif eth0 flags rst", []string{"1 accept local 192.168.0.2:22"}},
		{"ssh over IPv6", "tcp [fd00::9]:5555 -> [fd00::2]:22 iif eth0", []string{"1 accept local [fd00::2]:22"}},
		{"IPv6 source without a route back", "tcp [2001:db8::1]:5555 -> [fd00::2]:22 iif eth0", []string{"1 drop none [fd00::2]:22 at raw_PREROUTING"}},
		{"IPv6 source routed by another interface", "tcp [fd00::9]:5555 -> [fd00::2]:22 iif cni0", []string{"1 drop none [fd00::2]:22 at raw_PREROUTING"}},
		{"port forward to ssh", "tcp 1.2.3.4:5555 -> 192.168.0.2:8022 iif eth0", []string{"1 accept local 192.168.0.2:22"}},
		{"forward to the world, masqueraded", "tcp 10.1.0.5:5555 -> 8.8.8.8:53 iif cni0", []string{"1 accept forward 8.8.8.8:53 masq"}},
		{"forward to the pods rejected", "tcp 1.2.3.4:5555 -> 10.1.0.5:80 iif eth0", []string{"1 reject none 10.1.0.5:80 at filter_FORWARD"}},
		{"6to4 destination rejected", "tcp [fd00::9]:5555 -> [2002:a00::1]:80 iif eth0", []string{"1 reject none [2002:a00::1]:80 at filter_FORWARD"}},
		{"the node's own packets", "udp 192.168.0.2:5555 -> 8.8.8.8:53", []string{"1 accept out 8.8.8.8:53 masq"}},
	})
}

func TestIptablesNft(t *testing.T) {
	progs := map[string]*Program{"list": compileReal(t, "iptables-nft.list.nft", "xt match physdev")}
	if listing, ok := iptablesListing(t); ok {
		p, err := CompileTextOptions(listing, CompileOptions{Forks: true})
		if err != nil {
			t.Fatalf("the kernel's listing: %v\n%s", err, listing)
		}
		progs["kernel"] = p
	}
	const (
		bridged    = `xt match "physdev" matches`
		notBridged = `xt match "physdev" does not match`
	)
	runReal(t, progs, []realCase{
		{"clusterip from a pod: statistic picks, Docker's FORWARD policy drops", "tcp 10.1.0.9:40000 -> 172.30.0.10:80 iif cni0", []string{
			"[" + bridged + "] 0.5 accept forward 10.1.0.5:8080",
			"[" + bridged + "] 0.5 accept forward 10.2.0.5:8080",
			"[" + notBridged + "] 0.5 drop none 10.1.0.5:8080 at FORWARD",
			"[" + notBridged + "] 0.5 drop none 10.2.0.5:8080 at FORWARD",
		}},
		{"nodeport from outside: masqueraded, accepted by KUBE-FORWARD", "tcp 1.2.3.4:40000 -> 192.168.0.2:30080 iif eth0", []string{
			"[" + bridged + "] 0.5 accept forward 10.1.0.5:8080 masq",
			"[" + bridged + "] 0.5 accept forward 10.2.0.5:8080 masq",
			"[" + notBridged + "] 0.5 accept forward 10.1.0.5:8080 masq",
			"[" + notBridged + "] 0.5 accept forward 10.2.0.5:8080 masq",
		}},
		{"service without endpoints", "tcp 10.1.0.9:40000 -> 172.30.0.11:80 iif cni0", []string{
			"[" + bridged + "] 1 accept forward 172.30.0.11:80",
			"[" + notBridged + "] 1 reject none 172.30.0.11:80 at KUBE-SERVICES",
		}},
		{"docker published port", "tcp 1.2.3.4:40000 -> 192.168.0.2:8080 iif eth0", []string{
			"[" + bridged + "] 1 accept forward 172.17.0.2:80",
			"[" + notBridged + "] 1 accept forward 172.17.0.2:80",
		}},
		{"container to the world", "tcp 172.17.0.2:40000 -> 8.8.8.8:53 iif docker0", []string{
			"[" + bridged + "] 1 accept forward 8.8.8.8:53 masq",
			"[" + notBridged + "] 1 accept forward 8.8.8.8:53 masq",
		}},
		{"ssh under and over the limit", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0", []string{
			"[under limit rate 10/minute] 1 accept local 192.168.0.2:22",
			"[over limit rate 10/minute] 1 drop none 192.168.0.2:22 at INPUT",
		}},
		{"ping", "icmp 1.2.3.4 -> 192.168.0.2 iif eth0", []string{"1 accept local 192.168.0.2"}},
		{"dhcp reply to a container: xt target CHECKSUM, assumed to only fill in checksums", "udp 192.168.0.2:67 -> 172.17.0.2:68", []string{
			`[xt target "CHECKSUM" lets the packet go on (it fills in checksums)] 1 accept out 172.17.0.2:68`,
		}},
	})
}

// iptablesListing runs testdata/iptables-nft.sh in a throwaway network namespace and
// returns what `nft list ruleset` prints there.
func iptablesListing(t *testing.T) (string, bool) {
	t.Helper()
	if _, ok := kernelListing(t, "testdata/firewall.dump.nft"); !ok {
		return "", false
	}
	if m := testenv.Missing("iptables-nft"); m != "" {
		t.Logf("not running iptables-nft.sh: %s", m)
		return "", false
	}
	out, err := exec.Command("unshare", "-n", "sh", "-c", `sh testdata/iptables-nft.sh && nft list ruleset`).Output()
	if err != nil {
		t.Fatalf("iptables-nft.sh: %v", err)
	}
	return string(out), true
}
