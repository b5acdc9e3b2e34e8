package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/packet"
)

// testEnv is a node with one IPv4 and one IPv6 address.
var testEnv = nodeEnv

func mustCompile(t *testing.T, src string) *Program {
	t.Helper()
	p, err := CompileText(src)
	if err != nil {
		t.Fatalf("CompileText:\n%s\nerror: %v", src, err)
	}
	return p
}

func mustTrace(t *testing.T, p *Program, pkt string, env Env) *Trace {
	t.Helper()
	tr, err := p.Trace(packet.MustParse(pkt), env)
	if err != nil {
		t.Fatalf("Trace(%s): %v", pkt, err)
	}
	return tr
}

// matchProgram wraps rule (followed by "drop") in an inet prerouting chain, with the
// sets every match test may use.
func matchProgram(t *testing.T, rule string) *Program {
	return mustCompile(t, `table inet t {
	set s4 { type ipv4_addr; flags interval; elements = { 10.0.0.0/24, 192.0.2.7 } }
	set ports { type inet_proto . inet_service; flags interval; elements = { tcp . 1-1024, udp . 53 } }
	set pairs { type ipv4_addr . ipv4_addr; elements = { 10.0.0.5 . 1.1.1.1 } }
	set names { type ifname; flags interval; elements = { "veth*", "lo" } }
	chain c {
		type filter hook prerouting priority 0; policy accept;
		`+rule+` drop
	}
}`)
}

func TestMatches(t *testing.T) {
	const (
		tcp4 = "tcp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0"
		udp4 = "udp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0"
		tcp6 = "tcp [fd00::5]:1 -> [fd00::9]:2 iif eth0"
		icmp = "icmp 10.0.0.5 -> 1.1.1.1 iif eth0"
	)
	tests := []struct {
		rule, pkt string
		want      bool
	}{
		// ip / ip6 payload
		{"ip saddr 10.0.0.5", tcp4, true},
		{"ip saddr 10.0.0.6", tcp4, false},
		{"ip saddr != 10.0.0.6", tcp4, true},
		{"ip saddr == 10.0.0.5", tcp4, true},
		{"ip saddr 10.0.0.0/8", tcp4, true},
		{"ip saddr 10.0.1.0/24", tcp4, false},
		{"ip saddr != 10.0.0.0/8", tcp4, false},
		{"ip saddr 10.0.0.1-10.0.0.9", tcp4, true},
		{"ip saddr 10.0.0.6-10.0.0.9", tcp4, false},
		{"ip daddr { 1.1.1.1, 2.2.2.2 }", tcp4, true},
		{"ip daddr != { 1.1.1.0/24 }", tcp4, false},
		{"ip daddr != { 1.1.2.0/24, 3.3.3.3 }", tcp4, true},
		{"ip protocol tcp", tcp4, true},
		{"ip saddr & 255.255.255.0 == 10.0.0.0", tcp4, true},
		{"ip saddr & 255.255.0.0 == 10.1.0.0", tcp4, false},
		{"ip6 saddr & ffff:ffff:: == fd00::", tcp6, true},
		{"ip protocol udp", tcp4, false},
		{"ip saddr 10.0.0.5", tcp6, false},
		{"ip6 saddr fd00::/64", tcp6, true},
		{"ip6 saddr fd00::6", tcp6, false},
		{"ip6 daddr fd00::9", tcp6, true},
		{"ip6 nexthdr tcp", tcp6, true},
		{"ip6 saddr fd00::/64", tcp4, false},
		// transport
		{"tcp dport 2", tcp4, true},
		{"tcp dport 2", udp4, false},
		{"udp sport 1", udp4, true},
		{"th dport 2", udp4, true},
		{"th dport 2", icmp, false},
		{"th dport != 3", icmp, false},
		{"tcp dport 1-1024", tcp4, true},
		{"tcp dport < 3", tcp4, true},
		{"tcp dport > 2", tcp4, false},
		{"tcp dport >= 2", tcp4, true},
		{"tcp dport <= 1", tcp4, false},
		{"tcp dport { 22, 1-5 }", tcp4, true},
		{"tcp dport { 22, 80-90 }", tcp4, false},
		{"tcp dport ssh", "tcp 1.1.1.1:1 -> 2.2.2.2:22", true},
		{"sctp dport 2", "sctp 1.1.1.1:1 -> 2.2.2.2:2", true},
		// meta
		{"meta l4proto tcp", tcp4, true},
		{"meta l4proto { udp, sctp }", tcp4, false},
		{"l4proto udp", udp4, true},
		{"meta l4proto icmp", icmp, true},
		{"meta nfproto ipv4", tcp4, true},
		{"meta nfproto ipv6", tcp4, false},
		{"meta protocol ip6", tcp6, true},
		{"iifname eth0", tcp4, true},
		{`iifname "eth*"`, tcp4, true},
		{`iifname "veth*"`, tcp4, false},
		{`iifname != "veth*"`, tcp4, true},
		{`iifname != "veth*"`, "tcp 1.1.1.1:1 -> 2.2.2.2:2 iif veth3", false},
		{`iifname @names`, "tcp 1.1.1.1:1 -> 2.2.2.2:2 iif veth3", true},
		{`iifname @names`, "tcp 1.1.1.1:1 -> 2.2.2.2:2 iif lo", true},
		{`iifname @names`, "tcp 1.1.1.1:1 -> 2.2.2.2:2 iif lo0", false},
		{`iif "eth0"`, tcp4, true},
		{`meta iif lo`, tcp4, false},
		{"oifname eth1", "tcp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0 oif eth1", true},
		{"meta mark 0x10", "tcp 1.1.1.1:1 -> 2.2.2.2:2 mark 0x10", true},
		{"meta mark 0x00000010", "tcp 1.1.1.1:1 -> 2.2.2.2:2 mark 16", true},
		{"mark 0x10", "tcp 1.1.1.1:1 -> 2.2.2.2:2", false},
		{"mark & 0xf0 == 0x10", "tcp 1.1.1.1:1 -> 2.2.2.2:2 mark 0x13", true},
		{"meta mark & 0x00004000 == 0x00000000", "tcp 1.1.1.1:1 -> 2.2.2.2:2 mark 0x4000", false},
		{"mark and 0x4000 != 0", "tcp 1.1.1.1:1 -> 2.2.2.2:2", false},
		{"mark or 0x1 == 0x11", "tcp 1.1.1.1:1 -> 2.2.2.2:2 mark 0x10", true},
		{"mark ^ 0x3 == 0x13", "tcp 1.1.1.1:1 -> 2.2.2.2:2 mark 0x10", true},
		{"mark >> 4 == 0x1", "tcp 1.1.1.1:1 -> 2.2.2.2:2 mark 0x10", true},
		{"mark << 1 == 0x20", "tcp 1.1.1.1:1 -> 2.2.2.2:2 mark 0x10", true},
		// conntrack
		{"ct state new", tcp4, true},
		{"ct state established,related", tcp4, false},
		{"ct state established,related", tcp4 + " ct related", true},
		{"ct state established", tcp4 + " ct established", true},
		{"ct state != new", tcp4 + " ct established", true},
		{"ct state == new", tcp4, true},
		{"ct state { new, untracked }", tcp4 + " ct untracked", true},
		{"ct state untracked", tcp4 + " ct untracked", true},
		{"ct state invalid", tcp4 + " ct invalid", true},
		{"ct status dnat", tcp4, false},
		{"ct original ip daddr 1.1.1.1", tcp4, true},
		{"ct original ip saddr 1.1.1.1", tcp4, false},
		{"ct reply ip saddr 1.1.1.1", tcp4, true},
		{"meta l4proto tcp ct original proto-dst 2", tcp4, true},
		{"tcp sport 1 ct reply proto-src 2", tcp4, true},
		{"ct protocol tcp ct original proto-dst 3", tcp4, false},
		{"ct direction original", tcp4, true},
		{"ct l3proto ipv4", tcp4, true},
		{"ct protocol tcp", tcp4, true},
		{"ct original ip daddr 1.1.1.1", tcp4 + " ct untracked", false},
		// fib against the node's addresses
		{"fib daddr type local", "tcp 1.1.1.1:1 -> 192.168.0.2:2 iif eth0", true},
		{"fib daddr type local", tcp4, false},
		{"fib daddr type unicast", tcp4, true},
		{"fib daddr . iif type local", "tcp 1.1.1.1:1 -> 192.168.0.2:2 iif eth0", true},
		{"fib saddr type local", "tcp 127.0.0.1:1 -> 192.168.0.2:2 iif lo", true},
		{"fib daddr type { multicast, broadcast }", "udp 1.1.1.1:1 -> 224.0.0.9:2 iif eth0", true},
		{"fib daddr type != local", tcp4, true},
		// concatenations and sets
		{"ip saddr . tcp dport 10.0.0.5 . 2", tcp4, true},
		{"ip saddr . tcp dport 10.0.0.5 . 3", tcp4, false},
		{"ip saddr . tcp dport { 10.0.0.0/8 . 1-1024 }", tcp4, true},
		{"ip saddr . tcp dport { 10.0.0.0/8 . 3-1024, 10.0.0.5 . 2 }", tcp4, true},
		{"ip saddr . tcp dport { 10.0.0.0/8 . 3-1024, 10.0.0.6 . 2 }", tcp4, false},
		{"ip saddr @s4", tcp4, true},
		{"ip saddr @s4", "tcp 192.0.2.7:1 -> 1.1.1.1:2", true},
		{"ip saddr @s4", "tcp 192.0.2.8:1 -> 1.1.1.1:2", false},
		{"ip saddr != @s4", tcp4, false},
		{"meta l4proto . th dport @ports", tcp4, true},
		{"meta l4proto . th dport @ports", udp4, false},
		{"meta l4proto . th dport @ports", "udp 1.1.1.1:1 -> 2.2.2.2:53", true},
		{"ip saddr . ip daddr @pairs", tcp4, true},
		{"ip daddr . ip saddr @pairs", tcp4, false},
		// several matches in one rule
		{"ip saddr 10.0.0.5 tcp dport 2 meta l4proto tcp", tcp4, true},
		{"ip saddr 10.0.0.5 tcp dport 3 meta l4proto tcp", tcp4, false},
	}
	for _, tt := range tests {
		t.Run(tt.rule+"/"+tt.pkt, func(t *testing.T) {
			tr := mustTrace(t, matchProgram(t, tt.rule), tt.pkt, testEnv)
			v, ok := tr.Verdict()
			if !ok {
				t.Fatalf("branches disagree:\n%s", tr)
			}
			if got := v == VerdictDrop; got != tt.want {
				t.Errorf("%q on %s: matched = %v, want %v\n%s", tt.rule, tt.pkt, got, tt.want, tr)
			}
		})
	}
}

func TestNumgen(t *testing.T) {
	p := matchProgram(t, "numgen random mod 3 vmap { 0 : drop, 1 : accept, 2 : drop }")
	tr := mustTrace(t, p, "tcp 1.1.1.1:1 -> 2.2.2.2:2", testEnv)
	if len(tr.Branches) != 3 {
		t.Fatalf("want 3 branches:\n%s", tr)
	}
	var drop float64
	for i, b := range tr.Branches {
		if len(b.Choices) != 1 || b.Choices[0].Mod != 3 || b.Choices[0].Value != i {
			t.Errorf("branch %d choices %+v", i, b.Choices)
		}
		if b.Outcome.Verdict == VerdictDrop {
			drop += b.Probability
		}
	}
	if math.Abs(drop-2.0/3) > 1e-12 {
		t.Errorf("drop probability %v, want 2/3", drop)
	}
	if _, ok := tr.Verdict(); ok {
		t.Error("Verdict() should report disagreement")
	}

	// Offsets shift the values; nested numgen multiplies probabilities.
	p = mustCompile(t, `table ip t { chain c { type filter hook prerouting priority 0; policy accept;
		numgen random mod 2 offset 5 vmap { 5 : jump a, 6 : accept }
	}
	chain a { numgen random mod 2 vmap { 0 : drop, 1 : accept } } }`)
	tr = mustTrace(t, p, "tcp 1.1.1.1:1 -> 2.2.2.2:2", testEnv)
	if len(tr.Branches) != 3 {
		t.Fatalf("want 3 branches:\n%s", tr)
	}
	probs := map[string]float64{}
	for _, b := range tr.Branches {
		probs[b.Outcome.Verdict.String()] += b.Probability
	}
	if probs["drop"] != 0.25 || probs["accept"] != 0.75 {
		t.Errorf("probabilities %v, want drop 0.25 accept 0.75\n%s", probs, tr)
	}

	// numgen inc counts the packets committed by a Runtime.
	p = matchProgram(t, "numgen inc mod 3 vmap { 0 : drop, 1 : accept, 2 : accept }")
	rt := NewRuntime(p, testEnv)
	var got []string
	for i := 0; i < 5; i++ {
		tr, err := rt.Trace(packet.MustParse("tcp 1.1.1.1:1 -> 2.2.2.2:2"))
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Branches) != 1 {
			t.Fatalf("numgen inc forked:\n%s", tr)
		}
		v, _ := tr.Verdict()
		got = append(got, v.String())
	}
	if strings.Join(got, " ") != "drop accept accept drop accept" {
		t.Errorf("numgen inc sequence %v", got)
	}
}

func TestCTStateBeforeConntrack(t *testing.T) {
	// Below priority -200 conntrack has not looked at the packet yet: ct state reads
	// invalid, and notrack there makes the packet untracked for later chains.
	p := mustCompile(t, `table ip t {
		chain raw { type filter hook prerouting priority raw; policy accept;
			ct state invalid meta mark set 0x1
			tcp dport 9 notrack
		}
		chain f { type filter hook prerouting priority filter; policy accept;
			ct state untracked meta mark set meta mark | 0x10
			ct state new meta mark set meta mark | 0x100
		}
	}`)
	tr := mustTrace(t, p, "tcp 1.1.1.1:1 -> 2.2.2.2:2 iif eth0", testEnv)
	if m := tr.Branches[0].Outcome.Packet.Mark; m != 0x101 {
		t.Errorf("mark %#x, want 0x101\n%s", m, tr)
	}
	tr = mustTrace(t, p, "tcp 1.1.1.1:1 -> 2.2.2.2:9 iif eth0", testEnv)
	if m := tr.Branches[0].Outcome.Packet.Mark; m != 0x11 {
		t.Errorf("mark %#x, want 0x11\n%s", m, tr)
	}
}
