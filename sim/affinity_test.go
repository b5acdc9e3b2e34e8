package sim

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/packet"
)

// The affinity golden ruleset (testdata/affinity.*.nft) is the proxier's session
// affinity design: the nat chain of an affinity frontend DNATs a remembered client
// through the dynamic map @affinity (client . frontend : endpoint) and sends any other
// client to dnat-N; after DNAT, a filter chain at priority -90 looks the connection's
// frontend . endpoint up in @affinity-endpoints and goes to affinity-record-T, which
// records (or refreshes) the client with "update @affinity { ... timeout T : ... }".
// It also holds the firewall of LoadBalancer 100.64.0.1: "frontend . source !=
// @firewall-allow drop" for the frontends in @firewall-ips.

// affinityRuntime returns a Runtime of prog on nodeEnv with a manual clock, which
// commits the branch that DNATs to pick when there is a choice.
func affinityRuntime(t *testing.T, prog *Program, pick string) (*Runtime, *ManualClock) {
	t.Helper()
	clock := NewManualClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	env := nodeEnv
	env.Clock = clock
	env.Select = func(tr *Trace) int {
		for i, b := range tr.Branches {
			if b.Outcome.Packet.Dst.String() == pick {
				return i
			}
		}
		t.Fatalf("no branch to %s in\n%s", pick, tr)
		return 0
	}
	return NewRuntime(prog, env), clock
}

// traceRT traces pkt through rt and fails the test on an error.
func traceRT(t *testing.T, rt *Runtime, pkt string) *Trace {
	t.Helper()
	tr, err := rt.Trace(packet.MustParse(pkt))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// wantTraceText fails unless the rendered trace contains every one of wants.
func wantTraceText(t *testing.T, tr *Trace, wants ...string) {
	t.Helper()
	s := tr.String()
	for _, w := range wants {
		if !strings.Contains(s, w) {
			t.Errorf("trace lacks %q:\n%s", w, s)
		}
	}
}

func wantElements(t *testing.T, rt *Runtime, table, name string, want ...string) {
	t.Helper()
	got := rt.SetElements(table, name)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("@%s = %q, want %q", name, got, want)
	}
}

// TestAffinityMap follows clients through the affinity design, in the dump form, in
// nft's listing of it (which drops the "meta l4proto tcp" of the record and check
// rules, and prints "timeout 3h" and "tcp dport") and, as root, in the kernel's
// listing.
func TestAffinityMap(t *testing.T) {
	const (
		c1     = "tcp 10.0.0.9:40000 -> 172.30.0.1:80 iif eth0"
		key    = "10.0.0.9 . 172.30.0.1 . tcp . 80"
		sticky = "10.1.0.6:8080"
		other  = "10.1.0.5:8080"
		elem   = key + " : 10.1.0.6 . 8080"
		noElem = "no element " + key + " in @affinity"
		anyEP  = "two endpoints"
		oneEP  = "the remembered endpoint"
	)
	for form, prog := range loadGolden(t, "affinity") {
		t.Run(form, func(t *testing.T) {
			rt, clock := affinityRuntime(t, prog, sticky)
			conn := func(pkt, endpoints string) *Trace {
				t.Helper()
				tr := traceRT(t, rt, pkt)
				switch endpoints {
				case anyEP:
					checkOutcomes(t, tr, []want{{dst: other, p: 0.5, v: A, d: Fw}, {dst: sticky, p: 0.5, v: A, d: Fw}})
				case oneEP:
					checkOutcomes(t, tr, []want{{dst: sticky, v: A, d: Fw}})
				}
				return tr
			}

			// The first connection misses the map, goes through numgen and is
			// recorded with the endpoint of the committed branch.
			tr := conn(c1, anyEP)
			wantTraceText(t, tr, noElem, "update "+elem+" in @affinity, timeout 3h")
			wantElements(t, rt, "ip aff", "affinity", elem)

			// A new connection from the same client (another source port) is DNATed
			// by the map to the same endpoint, without numgen, and refreshes the
			// record.
			clock.Advance(time.Hour)
			tr = conn("tcp 10.0.0.9:40001 -> 172.30.0.1:80 iif eth0", oneEP)
			wantTraceText(t, tr,
				"-> dnat to 10.1.0.6:8080  (element "+elem+" in @affinity (added by a packet, expires in 2h))",
				"update "+elem+" in @affinity: already there, timeout refreshed to 3h")

			// So is the same source port once its conntrack entry is gone.
			rt.FlushConntrack()
			conn(c1, oneEP)

			// Another client is not.
			conn("tcp 10.0.0.10:40000 -> 172.30.0.1:80 iif eth0", anyEP)
			// Nor is the client on another frontend of the same endpoints.
			tr = conn("tcp 10.0.0.9:40002 -> 100.64.0.1:80 iif eth0", anyEP)
			wantTraceText(t, tr, "no element 100.64.0.1 . tcp . 80 . 10.1.0.6 . 8080 in @affinity-endpoints")

			// Without the refresh the record would have expired 3h after the first
			// connection; the refresh an hour later keeps it until 4h.
			clock.Advance(2*time.Hour + 30*time.Minute)
			wantElements(t, rt, "ip aff", "affinity",
				"10.0.0.10 . 172.30.0.1 . tcp . 80 : 10.1.0.6 . 8080", elem)
			clock.Advance(30*time.Minute + time.Second)
			wantElements(t, rt, "ip aff", "affinity")
			tr = conn("tcp 10.0.0.9:40003 -> 172.30.0.1:80 iif eth0", anyEP)
			wantTraceText(t, tr, noElem)

			// A packet of an established connection does not run the nat chains,
			// whatever the map says.
			rt2, _ := affinityRuntime(t, prog, other)
			traceRT(t, rt2, c1)
			tr = traceRT(t, rt2, c1)
			checkOutcomes(t, tr, []want{{dst: other, v: A, d: Fw}})
		})
	}
}

// TestAffinityMapUDPAndOutput checks a UDP frontend with its own record timeout
// (affinity-record-60: the element timeout overrides the map's 3h) and the output
// path of a node-local client.
func TestAffinityMapUDPAndOutput(t *testing.T) {
	for form, prog := range loadGolden(t, "affinity") {
		t.Run(form, func(t *testing.T) {
			rt, clock := affinityRuntime(t, prog, "10.1.0.8:5353")
			tr := traceRT(t, rt, "udp 10.0.0.9:5000 -> 172.30.0.3:53 iif eth0")
			checkOutcomes(t, tr, []want{{dst: "10.1.0.8:5353", v: A, d: Fw}})
			wantTraceText(t, tr, "update 10.0.0.9 . 172.30.0.3 . udp . 53 : 10.1.0.8 . 5353 in @affinity, timeout 1m")
			clock.Advance(59 * time.Second)
			wantElements(t, rt, "ip aff", "affinity", "10.0.0.9 . 172.30.0.3 . udp . 53 : 10.1.0.8 . 5353")
			clock.Advance(time.Second)
			wantElements(t, rt, "ip aff", "affinity")

			// The node itself is a client too: output, nat at -100, then the
			// post-DNAT filter chain at -90 of the output hook records it.
			rt, _ = affinityRuntime(t, prog, "10.1.0.5:8080")
			tr = traceRT(t, rt, "tcp 192.168.0.2:50000 -> 172.30.0.1:80")
			checkOutcomes(t, tr, []want{{dst: "10.1.0.5:8080", p: 0.5, v: A, d: Ou}, {dst: "10.1.0.6:8080", p: 0.5, v: A, d: Ou}})
			wantElements(t, rt, "ip aff", "affinity", "192.168.0.2 . 172.30.0.1 . tcp . 80 : 10.1.0.5 . 8080")
			tr = traceRT(t, rt, "tcp 192.168.0.2:50001 -> 172.30.0.1:80")
			checkOutcomes(t, tr, []want{{dst: "10.1.0.5:8080", v: A, d: Ou}})
		})
	}
}

// TestAffinityRecordOfRemovedEndpoint reloads the ruleset without the endpoint a
// client is recorded with in @affinity-endpoints: the record still DNATs the client
// until it expires, but nothing refreshes it, since the vmap misses.
func TestAffinityRecordOfRemovedEndpoint(t *testing.T) {
	dump, err := os.ReadFile("testdata/affinity.dump.nft")
	if err != nil {
		t.Fatal(err)
	}
	removed := "add element ip aff affinity-endpoints { 172.30.0.1 . tcp . 80 . 10.1.0.6 . 8080 : goto affinity-record-10800 }\n"
	if !strings.Contains(string(dump), removed) {
		t.Fatalf("affinity.dump.nft lacks %q", removed)
	}
	v1 := mustCompile(t, string(dump))
	v2 := mustCompile(t, strings.Replace(string(dump), removed, "", 1))
	rt, clock := affinityRuntime(t, v1, "10.1.0.6:8080")
	traceRT(t, rt, "tcp 10.0.0.9:40000 -> 172.30.0.1:80 iif eth0")
	rt.Load(v2)
	clock.Advance(2 * time.Hour)
	tr := traceRT(t, rt, "tcp 10.0.0.9:40001 -> 172.30.0.1:80 iif eth0")
	checkOutcomes(t, tr, []want{{dst: "10.1.0.6:8080", v: A, d: Fw}})
	wantTraceText(t, tr, "no element 172.30.0.1 . tcp . 80 . 10.1.0.6 . 8080 in @affinity-endpoints")
	if strings.Contains(tr.String(), "affinity-record") {
		t.Errorf("the record was refreshed:\n%s", tr)
	}
	clock.Advance(time.Hour)
	wantElements(t, rt, "ip aff", "affinity")
	tr = traceRT(t, rt, "tcp 10.0.0.9:40002 -> 172.30.0.1:80 iif eth0")
	checkOutcomes(t, tr, []want{{dst: "10.1.0.5:8080", p: 0.5, v: A, d: Fw}, {dst: "10.1.0.6:8080", p: 0.5, v: A, d: Fw}})
}

// affinity6 is the IPv6 form of the design. nft 1.0.6 cannot load its update rules:
// it aborts ("netlink_linearize.c:799: netlink_gen_expr: Assertion `dreg <
// ctx->reg_low' failed") on any map update whose key or data has an ipv6_addr followed
// by another field. The simulator follows the kernel's semantics all the same.
const affinity6 = `table ip6 aff {
	map affinity { type ipv6_addr . ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service; flags dynamic,timeout; size 1048576; timeout 3h; }
	map affinity-endpoints { type ipv6_addr . inet_proto . inet_service . ipv6_addr . inet_service : verdict;
		elements = { fd00:30::1 . tcp . 80 . fd00:1::5 . 8080 : goto affinity-record-10800, fd00:30::1 . tcp . 80 . fd00:1::6 . 8080 : goto affinity-record-10800 } }
	map backends { typeof ip6 daddr . meta l4proto . th dport . numgen random mod 1 : ip6 daddr . th dport;
		elements = { fd00:30::1 . tcp . 80 . 0 : fd00:1::5 . 8080, fd00:30::1 . tcp . 80 . 1 : fd00:1::6 . 8080 } }
	set firewall-ips { type ipv6_addr . inet_proto . inet_service; elements = { fd00:64::1 . tcp . 80 } }
	set firewall-allow { type ipv6_addr . inet_proto . inet_service . ipv6_addr; flags interval;
		elements = { fd00:64::1 . tcp . 80 . 2001:db8::/64, fd00:64::1 . tcp . 80 . 2001:db8:1::7, fd00:64::1 . tcp . 80 . 2001:db8:2::10-2001:db8:2::20 } }
	chain filter-prerouting { type filter hook prerouting priority dstnat - 10; policy accept;
		ct state new ip6 daddr . meta l4proto . th dport @firewall-ips ip6 daddr . meta l4proto . th dport . ip6 saddr != @firewall-allow drop
	}
	chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept;
		ip6 daddr fd00:30::1 tcp dport 80 goto affinity-3
		ip6 daddr fd00:64::1 tcp dport 80 dnat ip6 to [fd00:1::5]:8080
	}
	chain affinity-3 {
		meta l4proto { tcp, udp, sctp } dnat ip6 to ip6 saddr . ip6 daddr . meta l4proto . th dport map @affinity
		goto dnat-3
	}
	chain dnat-3 {
		meta l4proto { tcp, udp, sctp } dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 2 map @backends
	}
	chain filter-prerouting-post-dnat { type filter hook prerouting priority dstnat + 10; policy accept;
		ct state new ct status dnat jump affinity-check
	}
	chain affinity-check {
		meta l4proto tcp ct original ip6 daddr . meta l4proto . ct original proto-dst . ip6 daddr . th dport vmap @affinity-endpoints
		meta l4proto udp ct original ip6 daddr . meta l4proto . ct original proto-dst . ip6 daddr . th dport vmap @affinity-endpoints
	}
	chain affinity-record-10800 {
		meta l4proto tcp update @affinity { ip6 saddr . ct original ip6 daddr . meta l4proto . ct original proto-dst timeout 10800s : ip6 daddr . th dport }
		meta l4proto udp update @affinity { ip6 saddr . ct original ip6 daddr . meta l4proto . ct original proto-dst timeout 10800s : ip6 daddr . th dport }
	}
}`

func TestAffinityMapIPv6(t *testing.T) {
	rt, clock := affinityRuntime(t, mustCompile(t, affinity6), "[fd00:1::6]:8080")
	both := []want{{dst: "[fd00:1::5]:8080", p: 0.5, v: A, d: Fw}, {dst: "[fd00:1::6]:8080", p: 0.5, v: A, d: Fw}}
	elem := "2001:db8::9 . fd00:30::1 . tcp . 80 : fd00:1::6 . 8080"

	tr := traceRT(t, rt, "tcp [2001:db8::9]:40000 -> [fd00:30::1]:80 iif eth0")
	checkOutcomes(t, tr, both)
	wantTraceText(t, tr, "update "+elem+" in @affinity, timeout 3h")
	wantElements(t, rt, "ip6 aff", "affinity", elem)

	clock.Advance(time.Hour)
	tr = traceRT(t, rt, "tcp [2001:db8::9]:40001 -> [fd00:30::1]:80 iif eth0")
	checkOutcomes(t, tr, []want{{dst: "[fd00:1::6]:8080", v: A, d: Fw}})
	wantTraceText(t, tr, "element "+elem+" in @affinity (added by a packet, expires in 2h)", "timeout refreshed to 3h")

	checkOutcomes(t, traceRT(t, rt, "tcp [2001:db8::10]:40000 -> [fd00:30::1]:80 iif eth0"), both)

	clock.Advance(3*time.Hour - time.Second)
	checkOutcomes(t, traceRT(t, rt, "tcp [2001:db8::9]:40002 -> [fd00:30::1]:80 iif eth0"), []want{{dst: "[fd00:1::6]:8080", v: A, d: Fw}})
	clock.Advance(3*time.Hour + time.Second)
	wantElements(t, rt, "ip6 aff", "affinity")
	checkOutcomes(t, traceRT(t, rt, "tcp [2001:db8::9]:40003 -> [fd00:30::1]:80 iif eth0"), both)

	// The IPv6 firewall: a prefix, an address and a range of allowed sources.
	fw := mustCompile(t, affinity6)
	for _, tc := range []struct {
		pkt  string
		drop bool
	}{
		{"tcp [2001:db8::55]:1 -> [fd00:64::1]:80 iif eth0", false},
		{"tcp [2001:db8:1::7]:1 -> [fd00:64::1]:80 iif eth0", false},
		{"tcp [2001:db8:1::8]:1 -> [fd00:64::1]:80 iif eth0", true},
		{"tcp [2001:db8:2::15]:1 -> [fd00:64::1]:80 iif eth0", false},
		{"tcp [2001:db8:2::21]:1 -> [fd00:64::1]:80 iif eth0", true},
		{"tcp [2001:db8:3::1]:1 -> [fd00:64::1]:80 iif eth0", true},
		{"tcp [2001:db8:3::1]:1 -> [fd00:64::1]:81 iif eth0", false},
		{"tcp [2001:db8:3::1]:1 -> [fd00:30::1]:80 iif eth0", false},
	} {
		tr := mustTrace(t, fw, tc.pkt, nodeEnv)
		if v, _ := tr.Verdict(); (v == VerdictDrop) != tc.drop {
			t.Errorf("%s: verdict %s, want drop=%v\n%s", tc.pkt, v, tc.drop, tr)
		}
	}
}

// TestGoldenAffinityFirewall checks lookups of the interval concatenation
// @firewall-allow (frontend . source, with a prefix, an address and a range as the
// source) negated with "!=", for the frontends in @firewall-ips only.
func TestGoldenAffinityFirewall(t *testing.T) {
	both := []want{{dst: "10.1.0.5:8080", p: 0.5, v: A, d: Fw}, {dst: "10.1.0.6:8080", p: 0.5, v: A, d: Fw}}
	dropped := func(dst string) []want { return []want{{dst: dst, v: Dr, d: No, chain: "firewall-check"}} }
	runScenarios(t, "affinity", nodeEnv, []scenario{
		{"source in an allowed prefix", "tcp 192.0.2.55:1000 -> 100.64.0.1:80 iif eth0", both},
		{"allowed source address", "tcp 198.51.100.7:1000 -> 100.64.0.1:80 iif eth0", both},
		{"neighbour of the allowed address", "tcp 198.51.100.8:1000 -> 100.64.0.1:80 iif eth0", dropped("100.64.0.1:80")},
		{"first address of the allowed range", "tcp 203.0.113.10:1000 -> 100.64.0.1:80 iif eth0", both},
		{"last address of the allowed range", "tcp 203.0.113.20:1000 -> 100.64.0.1:80 iif eth0", both},
		{"address after the allowed range", "tcp 203.0.113.21:1000 -> 100.64.0.1:80 iif eth0", dropped("100.64.0.1:80")},
		{"address before the allowed prefix", "tcp 192.0.1.255:1000 -> 100.64.0.1:80 iif eth0", dropped("100.64.0.1:80")},
		{"the node itself is not allowed", "tcp 192.168.0.2:1000 -> 100.64.0.1:80", dropped("100.64.0.1:80")},
		{"other frontend without a firewall", "tcp 198.51.100.8:1000 -> 100.64.0.2:80 iif eth0", []want{{dst: "10.1.0.7:8080", v: A, d: Fw}}},
		{"other port of the firewalled address", "tcp 198.51.100.8:1000 -> 100.64.0.1:81 iif eth0", []want{{dst: "100.64.0.1:81", v: A, d: Fw}}},
		{"other protocol of the firewalled frontend", "udp 198.51.100.8:1000 -> 100.64.0.1:80 iif eth0", []want{{dst: "100.64.0.1:80", v: A, d: Fw}}},
		{"established packets are not checked", "tcp 198.51.100.8:1000 -> 100.64.0.1:80 iif eth0 ct established", []want{{dst: "100.64.0.1:80", v: A, d: Fw}}},
	})
}

// TestCTOriginalAfterDNAT checks what a filter chain at priority -90, after the nat
// chains at -100, sees: ct original ip daddr and proto-dst are the frontend the
// client sent to, ip daddr and th dport the endpoint; at -110 ip daddr is still the
// frontend. It checks the first packet of a connection and, through a Runtime, a later
// one, on prerouting and on output.
func TestCTOriginalAfterDNAT(t *testing.T) {
	p := mustCompile(t, `table ip t {
		chain pre-nat { type nat hook prerouting priority dstnat; ip daddr 172.30.0.1 tcp dport 80 dnat to 10.1.0.5:8080 }
		chain out-nat { type nat hook output priority -100; ip daddr 172.30.0.1 tcp dport 80 dnat to 10.1.0.5:8080 }
		chain pre-before { type filter hook prerouting priority -110; ip daddr 172.30.0.1 mark set mark or 0x1 }
		chain out-before { type filter hook output priority -110; ip daddr 172.30.0.1 mark set mark or 0x1 }
		chain pre-after { type filter hook prerouting priority -90; jump check }
		chain out-after { type filter hook output priority -90; jump check }
		chain check {
			ct original ip daddr 172.30.0.1 ip daddr 10.1.0.5 mark set mark or 0x2
			meta l4proto tcp ct original proto-dst 80 th dport 8080 mark set mark or 0x4
			meta l4proto tcp ct original ip daddr . meta l4proto . ct original proto-dst . ip daddr . th dport { 172.30.0.1 . tcp . 80 . 10.1.0.5 . 8080 } mark set mark or 0x8
			meta l4proto tcp ct reply ip saddr 10.1.0.5 ct reply proto-src 8080 mark set mark or 0x10
		}
	}`)
	rt := NewRuntime(p, nodeEnv)
	for _, pkt := range []string{
		"tcp 10.0.0.9:40000 -> 172.30.0.1:80 iif eth0",
		"tcp 10.0.0.9:40000 -> 172.30.0.1:80 iif eth0", // the same connection, established
		"tcp 192.168.0.2:40000 -> 172.30.0.1:80",
		"tcp 192.168.0.2:40000 -> 172.30.0.1:80",
	} {
		tr := traceRT(t, rt, pkt)
		o := tr.Branches[0].Outcome
		if o.Packet.Mark != 0x1f || o.Packet.Dst.String() != "10.1.0.5:8080" {
			t.Errorf("%s: mark %#x dst %s, want 0x1f 10.1.0.5:8080\n%s", pkt, o.Packet.Mark, o.Packet.Dst, tr)
		}
	}
	if n := len(rt.Conns()); n != 2 {
		t.Errorf("%d conntrack entries, want 2", n)
	}
}

// TestMapUpdateSemantics checks nft_dynset's semantics on maps, as kernel 6.18 shows
// them: update refreshes the timeout of an element that is there but keeps its data
// (only a new element gets the statement's data); add changes nothing; an element
// added without a timeout keeps none; delete (which needs data on a map) removes the
// element. An element is visible to the rest of the packet's path at once. Constant
// data and a map lookup as data work too.
func TestMapUpdateSemantics(t *testing.T) {
	p := mustCompile(t, `table ip t {
		map m { type ipv4_addr : mark; flags dynamic,timeout; timeout 1h; }
		map a { type ipv4_addr : mark; flags dynamic,timeout; timeout 1h; }
		map forever { type ipv4_addr : ipv4_addr . inet_service; flags dynamic,timeout; }
		map ports { type inet_service : mark; elements = { 7 : 0x7 } }
		map marks { type ipv4_addr : mark; flags dynamic,timeout; }
		chain c { type filter hook output priority 0;
			udp dport != 11 update @m { ip daddr timeout 30m : meta mark }
			add @a { ip daddr : meta mark }
			udp dport 9 update @forever { ip daddr : 10.0.0.1 . 53 }
			udp dport 10 update @forever { ip daddr timeout 1m : 10.0.0.2 . 54 }
			udp dport 11 delete @m { ip daddr : 0 }
			udp dport { 7, 8 } update @marks { ip daddr timeout 1m : udp dport map @ports }
			meta mark set meta mark | 0x1000
			meta mark set ip daddr map @m
		}
	}`)
	clock := NewManualClock(time.Unix(0, 0))
	env := testEnv
	env.Clock = clock
	rt := NewRuntime(p, env)
	send := func(dport, mark string, want uint32) *Trace {
		t.Helper()
		tr := traceRT(t, rt, "udp 192.168.0.2:1 -> 8.8.8.8:"+dport+" mark "+mark)
		if got := tr.Branches[0].Outcome.Packet.Mark; got != want {
			t.Errorf("mark %#x, want %#x\n%s", got, want, tr)
		}
		return tr
	}
	// The final map lookup sees the element the packet added.
	send("9", "0x10", 0x10)
	clock.Advance(20 * time.Minute)
	tr := send("10", "0x20", 0x10)
	wantTraceText(t, tr,
		"update 8.8.8.8 : 0x00000010 in @m: already there, timeout refreshed to 30m, data 0x00000020 not written (update keeps an element's data)",
		"8.8.8.8 : 0x00000010 already in @a",
		"update 8.8.8.8 : 10.0.0.1 . 53 in @forever: already there, data 10.0.0.2 . 54 not written",
		"element 8.8.8.8 : 0x00000010 in @m (added by a packet, expires in 30m)")
	// 45m: @m, refreshed at 20m, is there; it would have expired at 30m.
	clock.Advance(25 * time.Minute)
	wantElements(t, rt, "ip t", "m", "8.8.8.8 : 0x00000010")
	wantElements(t, rt, "ip t", "a", "8.8.8.8 : 0x00000010")
	tr = send("11", "0x30", 0x1030)
	wantTraceText(t, tr, "delete 8.8.8.8 from @m", "no element 8.8.8.8 in @m")
	wantElements(t, rt, "ip t", "m")
	// 61m: @a, added at 0 and never refreshed, is gone; @forever has no timeout.
	clock.Advance(16 * time.Minute)
	wantElements(t, rt, "ip t", "a")
	wantElements(t, rt, "ip t", "forever", "8.8.8.8 : 10.0.0.1 . 53")

	// Data from a map lookup; a miss there ends the rule before the update.
	send("8", "0x40", 0x40)
	wantElements(t, rt, "ip t", "marks")
	send("7", "0x50", 0x40)
	wantElements(t, rt, "ip t", "marks", "8.8.8.8 : 0x00000007")
}

// TestListedMapElements parses a map as nft lists it with elements packets added:
// "KEY [timeout T] expires E : DATA". Each element lives E on the runtime's clock, and
// a packet that updates one makes it live on.
func TestListedMapElements(t *testing.T) {
	p := mustCompile(t, `table ip t {
	map affinity {
		type ipv4_addr . ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
		size 1048576
		flags dynamic,timeout
		timeout 3h
		elements = { 10.0.0.9 . 172.30.0.1 . tcp . 80 timeout 1m expires 59s992ms : 10.1.0.5 . 8080,
			     10.0.0.10 . 172.30.0.1 . tcp . 80 expires 2h59m59s984ms : 10.1.0.6 . 8080 }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		meta l4proto { tcp, udp, sctp } dnat ip to ip saddr . ip daddr . meta l4proto . th dport map @affinity
	}

	chain record {
		type filter hook prerouting priority dstnat + 10; policy accept;
		ip saddr 10.0.0.10 ct status dnat update @affinity { ip saddr . ct original ip daddr . meta l4proto . ct original proto-dst timeout 3h : ip daddr . tcp dport }
	}
}`)
	clock := NewManualClock(time.Unix(0, 0))
	env := testEnv
	env.Clock = clock
	rt := NewRuntime(p, env)
	port := 40000
	dst := func(src string) string {
		t.Helper()
		port++ // a new connection each time
		tr := traceRT(t, rt, fmt.Sprintf("tcp %s:%d -> 172.30.0.1:80 iif eth0", src, port))
		return tr.Branches[0].Outcome.Packet.Dst.String()
	}
	if d := dst("10.0.0.9"); d != "10.1.0.5:8080" {
		t.Fatalf("listed element not used: %s", d)
	}
	clock.Advance(time.Minute)
	if d := dst("10.0.0.9"); d != "172.30.0.1:80" {
		t.Fatalf("after 1m: %s, want 172.30.0.1:80 (the element expired)", d)
	}
	// This refreshes the second element until 3h1m; listed, it expired just before 3h.
	if d := dst("10.0.0.10"); d != "10.1.0.6:8080" {
		t.Fatalf("after 1m: %s, want 10.1.0.6:8080", d)
	}
	clock.Advance(3*time.Hour - 30*time.Second)
	wantElements(t, rt, "ip t", "affinity", "10.0.0.10 . 172.30.0.1 . tcp . 80 : 10.1.0.6 . 8080")
	clock.Advance(30 * time.Second)
	wantElements(t, rt, "ip t", "affinity")
	if d := dst("10.0.0.10"); d != "172.30.0.1:80" {
		t.Fatalf("after 3h1m: %s, want 172.30.0.1:80 (the refreshed element expired)", d)
	}
}
