package sim

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/packet"
)

// fuzzRulesets are small rulesets exercising most of the syntax, used as seeds.
var fuzzRulesets = []string{
	`table inet f { set s { type ipv4_addr; flags interval; elements = { 10.0.0.0/8, 1.2.3.4 } }
	chain in { type filter hook input priority filter; policy drop;
		ct state established,related accept
		iifname "lo" accept
		ip saddr @s tcp dport { 22, 80-90 } counter accept comment "x"
		meta l4proto { icmp, ipv6-icmp } accept
		tcp dport 23 reject with tcp reset
	}
}`,
	`table ip n { map m { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport; elements = { 1.1.1.1 . tcp . 80 . 0 : 10.0.0.1 . 8080, 1.1.1.1 . tcp . 80 . 1 : 10.0.0.2 . 8080 } }
	set aff { type ipv4_addr; flags dynamic,timeout; timeout 3h; }
	chain pre { type nat hook prerouting priority dstnat; policy accept;
		ip saddr @aff dnat to 10.0.0.1:8080
		update @aff { ip saddr }
		meta l4proto tcp dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @m
	}
	chain post { type nat hook postrouting priority srcnat;
		meta mark & 0x4000 == 0x4000 masquerade fully-random
		ip saddr 10.0.0.0/8 snat to 192.168.0.9
	}
	chain out { type filter hook output priority -110; mark set mark or 0x4000; numgen inc mod 3 vmap { 0 : jump j, 1 : accept, 2 : continue } }
	chain j { fib daddr type local return; ct status dnat goto k }
	chain k { drop }
}`,
	"add table ip t\nadd chain ip t c { type filter hook forward priority 0 ; policy accept ; }\nadd rule ip t c ip daddr . tcp dport { 1.1.1.1 . 80 } drop\n",
}

// fuzzRules are single rules; FuzzTrace wraps rule-only inputs into rulesets with
// sets, filter chains at every hook and nat chains, so that mutations stay close to
// rules that compile.
var fuzzRules = []string{
	"tcp flags syn / fin,syn,rst,ack icmp type echo-request meta pkttype host accept",
	"tcp flags & (fin | syn | rst | ack) == syn ip ttl 64 ip dscp cs0 meta length 60 drop",
	"meta random & 2147483647 < 1073741824 jump j",
	"meta nfproto ipv6 fib saddr . mark . iif oif missing drop",
	"meta skuid 0 meta iiftype loopback icmpv6 type { nd-router-advert, nd-neighbor-solicit } accept",
	"limit rate over 10/second burst 5 packets xt match physdev quota 10 mbytes ct count over 3 drop",
	"xt target \"CHECKSUM\" meta cpu 1 socket transparent 1 drop",
	"ip saddr 10.0.0.0/8 tcp dport { 22, 80-90 } accept",
	"ip daddr . meta l4proto . th dport vmap @vm",
	"ip daddr . meta l4proto . th dport @ports4 jump j",
	"meta mark & 0x00004000 == 0x00000000 return",
	"meta mark set meta mark | 0x4000",
	"mark set mark xor 0x4000",
	"ct state established,related accept",
	"ct status dnat ip saddr . ip daddr @pairs jump j",
	"iifname != \"veth*\" ip6 saddr fd00::/64 drop",
	"numgen random mod 3 vmap { 0 : jump j, 1 : goto j, 2 : drop }",
	"meta l4proto { tcp, udp, sctp } dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends",
	"tcp dport 80 dnat to 10.9.9.9:8080",
	"masquerade fully-random",
	"snat ip to 192.168.0.99:5000",
	"update @dyn { ip saddr timeout 1m } ip saddr @dyn counter log prefix \"x\" accept",
	"fib saddr type local reject with tcp reset",
	"ct original ip daddr 1.1.1.1 ct mark set 0x5 meta mark set ct mark",
	"numgen inc mod 2 offset 1 vmap { 1 : accept, 2 : drop }",
	"meta mark set ip saddr map { 10.0.0.5 : 0x7 }",
	"meta l4proto tcp update @aff { ip saddr . ct original ip daddr . meta l4proto . ct original proto-dst timeout 10800s : ip daddr . th dport }",
	"update @aff { ip saddr . ct original ip daddr . meta l4proto . ct original proto-dst timeout 3h : ip daddr . tcp dport }",
	"meta l4proto { tcp, udp, sctp } dnat ip to ip saddr . ip daddr . meta l4proto . th dport map @aff",
	"meta l4proto tcp ct original ip daddr . meta l4proto . ct original proto-dst . ip daddr . th dport vmap @affep",
	"ip daddr . meta l4proto . th dport . ip saddr != @fwallow drop",
}

// wrapRule builds the rulesets FuzzTrace tries for a rule-only input.
func wrapRule(rule string) []string {
	sets := `
	set pairs { type ipv4_addr . ipv4_addr; elements = { 10.0.0.5 . 10.0.0.5 } }
	set dyn { type ipv4_addr; flags dynamic,timeout; timeout 3h; }
	set ports4 { type ipv4_addr . inet_proto . inet_service; flags interval; elements = { 10.0.0.0/8 . tcp . 1-1024 } }
	map vm { type ipv4_addr . inet_proto . inet_service : verdict; elements = { 1.1.1.1 . tcp . 80 : goto j, 172.30.0.41 . tcp . 80 : drop } }
	map backends { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport; elements = { 172.30.0.41 . tcp . 80 . 0 : 10.0.0.1 . 8080, 172.30.0.41 . tcp . 80 . 1 : 10.0.0.2 . 8080 } }
	map aff { type ipv4_addr . ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; flags dynamic,timeout; timeout 3h; elements = { 10.0.0.9 . 1.1.1.1 . tcp . 80 timeout 1m expires 59s992ms : 10.0.0.1 . 8080 } }
	map affep { type ipv4_addr . inet_proto . inet_service . ipv4_addr . inet_service : verdict; elements = { 1.1.1.1 . tcp . 80 . 1.1.1.1 . 80 : goto j, 172.30.0.41 . tcp . 80 . 172.30.0.41 . 80 : jump j } }
	set fwallow { type ipv4_addr . inet_proto . inet_service . ipv4_addr; flags interval; elements = { 1.1.1.1 . tcp . 80 . 10.0.0.0/24, 172.30.0.41 . tcp . 1-1024 . 1.2.3.0-1.2.3.9 } }
	chain j { meta mark set meta mark | 0x1 }
`
	chains := func(family, typ string, hooks ...string) string {
		var b strings.Builder
		b.WriteString("table " + family + " t {" + sets)
		for _, h := range hooks {
			prio := "0"
			if typ == "nat" {
				prio = map[string]string{"prerouting": "dstnat", "output": "-100", "postrouting": "srcnat", "input": "100"}[h]
			}
			fmt.Fprintf(&b, "\tchain %s { type %s hook %s priority %s; policy accept;\n\t\t%s\n\t}\n", h, typ, h, prio, rule)
		}
		b.WriteString("}\n")
		return b.String()
	}
	return []string{
		chains("inet", "filter", "prerouting", "input", "forward", "output", "postrouting"),
		chains("ip", "nat", "prerouting", "output"),
		chains("ip", "nat", "postrouting", "input"),
	}
}

var fuzzPackets = []string{
	"tcp 10.0.0.5:40000 -> 172.30.0.41:80 iif eth0",
	"tcp 1.2.3.4:1 -> 1.1.1.1:80 iif eth0",
	"udp [fd00::5]:53000 -> [fd00::10]:53",
	"tcp 192.168.0.2:40000 -> 192.168.0.2:30080",
	"icmp 10.0.0.5 -> 192.168.0.2 iif eth0 ct established",
}

func goldenSeeds(f *testing.F) []string {
	files, _ := filepath.Glob("testdata/*.nft")
	jsons, _ := filepath.Glob("testdata/*.json")
	files = append(files, jsons...)
	var out []string
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, string(b))
	}
	return out
}

// FuzzCompile checks that compiling any text never panics and that every failure is a
// positioned *CompileError.
func FuzzCompile(f *testing.F) {
	for _, s := range append(goldenSeeds(f), fuzzRulesets...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		_, err := CompileText(src)
		if err == nil {
			return
		}
		var ce *CompileError
		if !errors.As(err, &ce) {
			t.Fatalf("error %v (%T) is not a *CompileError", err, err)
		}
		if ce.Msg == "" && ce.Err == nil {
			t.Fatalf("error without a message: %#v", ce)
		}
	})
}

// FuzzTrace checks that tracing any packet through any ruleset that compiles never
// panics, that branch probabilities sum to 1, and that a Runtime can commit branches.
func FuzzTrace(f *testing.F) {
	for _, r := range append(append(goldenSeeds(f), fuzzRulesets...), fuzzRules...) {
		for _, p := range fuzzPackets {
			f.Add(r, p)
		}
	}
	f.Fuzz(func(t *testing.T, src, pkt string) {
		p, err := packet.Parse(pkt)
		if err != nil {
			return
		}
		srcs := []string{src}
		if !strings.Contains(src, "table") {
			srcs = wrapRule(src)
		}
		for _, s := range srcs {
			if prog, err := CompileTextOptions(s, CompileOptions{Forks: true}); err == nil {
				traceChecked(t, prog, p)
			}
		}
	})
}

// traceChecked traces p twice through a Runtime of prog and checks the invariants.
func traceChecked(t *testing.T, prog *Program, p packet.Packet) {
	{
		rt := NewRuntime(prog, testEnv)
		for i := 0; i < 2; i++ {
			tr, err := rt.Trace(p)
			if err != nil {
				var te *TraceError
				if !errors.As(err, &te) {
					t.Fatalf("error %v (%T) is not a *TraceError", err, err)
				}
				return
			}
			checkWorlds(t, tr)
			for _, b := range tr.Branches {
				if b.Outcome.Verdict > VerdictReject {
					t.Fatalf("bad verdict %d", b.Outcome.Verdict)
				}
				if (b.Outcome.Verdict == VerdictAccept) != (b.Outcome.Delivery != DeliveryNone) {
					t.Fatalf("verdict %s with delivery %s", b.Outcome.Verdict, b.Outcome.Delivery)
				}
			}

			_ = tr.String()
			_ = tr.Endpoints()
		}
	}
}

// TestFuzzSeedsCompile keeps the hand-written fuzz seeds meaningful: every ruleset
// compiles, and every rule compiles in at least one of its wrappings.
func TestFuzzSeedsCompile(t *testing.T) {
	for i, s := range fuzzRulesets {
		if _, err := CompileText(s); err != nil {
			t.Errorf("seed %d: %v", i, err)
		}
	}
	for _, r := range fuzzRules {
		var errs []string
		for _, s := range wrapRule(r) {
			if _, err := CompileText(s); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if len(errs) == 3 && !strings.Contains(strings.Join(errs, ""), "which a packet cannot show") {
			t.Errorf("rule %q compiles in no wrapping: %s", r, strings.Join(errs, "; "))
		}
	}
}

// checkWorlds checks that, for every way the assumed outcomes could go, the branches
// consistent with it have probabilities summing to 1 (without assumptions: all
// branches sum to 1).
func checkWorlds(t *testing.T, tr *Trace) {
	t.Helper()
	type site struct {
		where string
		n     int
	}
	siteIx := map[site]int{}
	picks := make([]map[int]int, len(tr.Branches)) // branch -> site -> value
	for i, b := range tr.Branches {
		picks[i] = map[int]int{}
		seen := map[string]int{}
		for _, ch := range b.Choices {
			if !ch.Assumed || ch.Mod < 2 {
				continue
			}
			w := fmt.Sprintf("%s/%s/%d/%s", ch.Table, ch.Chain, ch.Rule, ch.Expr)
			k := site{w, seen[w]}
			seen[w]++
			if _, ok := siteIx[k]; !ok {
				siteIx[k] = len(siteIx)
			}
			picks[i][siteIx[k]] = ch.Value
		}
	}
	if len(siteIx) > 12 {
		return
	}
	for world := 0; world < 1<<len(siteIx); world++ {
		sum := 0.0
		for i, b := range tr.Branches {
			ok := true
			for s, v := range picks[i] {
				if (world>>s)&1 != v {
					ok = false
				}
			}
			if ok {
				sum += b.Probability
			}
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Fatalf("world %b of %d assumption sites: branch probabilities sum to %v\n%s", world, len(siteIx), sum, tr)
		}
	}
}
