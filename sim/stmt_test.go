package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/packet"
)

func TestMarkSet(t *testing.T) {
	tests := []struct {
		rule string
		mark uint32 // initial
		want uint32
	}{
		{"meta mark set 0x10", 0, 0x10},
		{"mark set 16", 0, 0x10},
		{"mark set mark or 0x4000", 0x1, 0x4001},
		{"meta mark set meta mark | 0x00004000", 0x4000, 0x4000},
		{"mark set mark xor 0x4000", 0x4001, 0x1},
		{"mark set mark and 0xff", 0x1234, 0x34},
		{"meta mark set ip saddr map { 10.0.0.5 : 0x7, 10.0.0.6 : 0x8 }", 0, 0x7},
		{"meta mark set tcp dport map { 1-10 : 0x2 }", 0, 0x2},
		{"meta mark set ip daddr map { 9.9.9.9 : 0x7 }", 0x3, 0x3}, // map miss: the rule stops
		{"ct mark set 0x5 ct mark 0x5 meta mark set ct mark", 0, 0x5},
		{"meta nftrace set 1 counter log prefix \"x \" level info flags all comment \"c\" mark set 0x9", 0, 0x9},
		{"counter packets 10 bytes 100 mark set 0x9", 0, 0x9},
	}
	for _, tt := range tests {
		t.Run(tt.rule, func(t *testing.T) {
			p := mustCompile(t, `table ip t { chain c { type filter hook prerouting priority 0; policy accept;
				`+tt.rule+`
			} }`)
			pkt := packet.MustParse("tcp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0")
			pkt.Mark = tt.mark
			tr, err := p.Trace(pkt, testEnv)
			if err != nil {
				t.Fatal(err)
			}
			if got := tr.Branches[0].Outcome.Packet.Mark; got != tt.want {
				t.Errorf("mark = %#x, want %#x\n%s", got, tt.want, tr)
			}
		})
	}
}

// natProgram puts rule into an ip nat chain at hook.
func natProgram(t *testing.T, family, hook, rule string) *Program {
	prio := map[string]string{"prerouting": "dstnat", "output": "-100", "postrouting": "srcnat", "input": "100"}[hook]
	return mustCompile(t, "table "+family+" t { chain c { type nat hook "+hook+" priority "+prio+"; policy accept;\n"+rule+"\n} }")
}

func TestNAT(t *testing.T) {
	tests := []struct {
		family, hook, rule, pkt string
		dst, src                string // expected final addresses ("" = unchanged)
		masq                    bool
		delivery                Delivery
	}{
		{"ip", "prerouting", "tcp dport 80 dnat to 10.9.9.9:8080", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "10.9.9.9:8080", "", false, DeliveryForward},
		{"ip", "prerouting", "tcp dport 80 dnat to 10.9.9.9", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "10.9.9.9:80", "", false, DeliveryForward},
		{"ip", "prerouting", "tcp dport 80 dnat to :8080", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "2.2.2.2:8080", "", false, DeliveryForward},
		{"ip", "prerouting", "dnat to 192.168.0.2", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "192.168.0.2:80", "", false, DeliveryLocal},
		{"ip", "prerouting", "dnat to ip daddr map { 2.2.2.2 : 10.9.9.9 }", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "10.9.9.9:80", "", false, DeliveryForward},
		{"ip", "prerouting", "dnat ip to tcp dport map { 80 : 10.9.9.9 . 8080, 81 : 10.9.9.8 . 8081 }", "tcp 1.1.1.1:1 -> 2.2.2.2:81 iif eth0", "10.9.9.8:8081", "", false, DeliveryForward},
		{"ip", "prerouting", "dnat ip to tcp dport map { 80 : 10.9.9.9 . 8080 }", "tcp 1.1.1.1:1 -> 2.2.2.2:82 iif eth0", "", "", false, DeliveryForward},
		{"ip", "prerouting", "meta l4proto tcp dnat to 10.9.9.9:8080", "udp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "", "", false, DeliveryForward},
		{"ip", "prerouting", "dnat to 10.9.9.9", "icmp 1.1.1.1 -> 2.2.2.2 iif eth0", "10.9.9.9", "", false, DeliveryForward},
		{"ip", "prerouting", "redirect to :8080", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "192.168.0.2:8080", "", false, DeliveryLocal},
		{"ip", "output", "redirect to :8080", "tcp 192.168.0.2:1 -> 2.2.2.2:80", "127.0.0.1:8080", "", false, DeliveryLocal},
		{"ip", "output", "dnat to 10.9.9.9:8080", "tcp 192.168.0.2:1 -> 2.2.2.2:80", "10.9.9.9:8080", "", false, DeliveryOut},
		{"inet", "prerouting", "dnat ip to 10.9.9.9:8080", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "10.9.9.9:8080", "", false, DeliveryForward},
		{"inet", "prerouting", "dnat ip to 10.9.9.9:8080", "tcp [fd00::1]:1 -> [fd00::3]:80 iif eth0", "", "", false, DeliveryForward},
		{"inet", "prerouting", "dnat ip6 to [fd00::9]:8080", "tcp [fd00::1]:1 -> [fd00::3]:80 iif eth0", "[fd00::9]:8080", "", false, DeliveryForward},
		{"ip6", "prerouting", "dnat to fd00::9", "tcp [fd00::1]:1 -> [fd00::3]:80 iif eth0", "[fd00::9]:80", "", false, DeliveryForward},
		{"ip", "postrouting", "snat to 192.168.0.99", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "", "192.168.0.99:1", false, DeliveryForward},
		{"ip", "postrouting", "snat ip to 192.168.0.99:5000", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "", "192.168.0.99:5000", false, DeliveryForward},
		{"ip", "postrouting", "masquerade", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "", "192.168.0.2:1", true, DeliveryForward},
		{"ip", "postrouting", "masquerade to :9000 random,persistent", "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", "", "192.168.0.2:9000", true, DeliveryForward},
		{"ip6", "postrouting", "masquerade", "tcp [fd00::1]:1 -> [fd00::3]:80 iif eth0", "", "[fd00::2]:1", true, DeliveryForward},
		{"ip", "input", "snat to 10.10.10.10", "tcp 1.1.1.1:1 -> 192.168.0.2:80 iif eth0", "", "10.10.10.10:1", false, DeliveryLocal},
	}
	for _, tt := range tests {
		t.Run(tt.family+"/"+tt.hook+"/"+tt.rule+"/"+tt.pkt, func(t *testing.T) {
			p := natProgram(t, tt.family, tt.hook, tt.rule)
			pkt := packet.MustParse(tt.pkt)
			tr := mustTrace(t, p, tt.pkt, testEnv)
			o := tr.Branches[0].Outcome
			wantDst, wantSrc := formatAddrPort(pkt.Dst, pkt.Protocol), formatAddrPort(pkt.Src, pkt.Protocol)
			if tt.dst != "" {
				wantDst = tt.dst
			}
			if tt.src != "" {
				wantSrc = tt.src
			}
			if got := formatAddrPort(o.Packet.Dst, pkt.Protocol); got != wantDst {
				t.Errorf("dst = %s, want %s\n%s", got, wantDst, tr)
			}
			if got := formatAddrPort(o.Packet.Src, pkt.Protocol); got != wantSrc {
				t.Errorf("src = %s, want %s\n%s", got, wantSrc, tr)
			}
			if o.DNAT != (tt.dst != "") || o.SNAT != (tt.src != "") || o.Masquerade != tt.masq {
				t.Errorf("DNAT %v SNAT %v Masquerade %v\n%s", o.DNAT, o.SNAT, o.Masquerade, tr)
			}
			if o.Verdict != VerdictAccept || o.Delivery != tt.delivery {
				t.Errorf("verdict %s delivery %s, want accept %s\n%s", o.Verdict, o.Delivery, tt.delivery, tr)
			}
		})
	}
}

func TestNATChainsStopAtFirstBinding(t *testing.T) {
	// Like nf_nat_inet_fn: the nat chains of a hook run in priority order until one
	// sets up a translation, which takes effect at the NAT priority (-100): a filter
	// chain at -90 sees the new destination, one at -110 the old.
	p := mustCompile(t, `table ip a {
		chain first { type nat hook prerouting priority -100; tcp dport 80 dnat to 10.0.0.1 }
		chain early { type filter hook prerouting priority -110; ip daddr 2.2.2.2 meta mark set meta mark | 0x1 }
		chain late { type filter hook prerouting priority -90; ip daddr 10.0.0.1 meta mark set meta mark | 0x2 }
	}
	table ip b {
		chain second { type nat hook prerouting priority -50; dnat to 10.0.0.2 }
	}`)
	tr := mustTrace(t, p, "tcp 1.1.1.1:1 -> 2.2.2.2:80 iif eth0", testEnv)
	o := tr.Branches[0].Outcome
	if o.Packet.Dst.String() != "10.0.0.1:80" || o.Packet.Mark != 0x3 {
		t.Fatalf("got %s mark %#x\n%s", o.Packet.Dst, o.Packet.Mark, tr)
	}
	if strings.Contains(tr.String(), "chain second") {
		t.Errorf("second nat chain ran after a binding:\n%s", tr)
	}
	tr = mustTrace(t, p, "tcp 1.1.1.1:1 -> 2.2.2.2:81 iif eth0", testEnv)
	if d := tr.Branches[0].Outcome.Packet.Dst.String(); d != "10.0.0.2:81" {
		t.Fatalf("port 81: dst %s, want the second chain's 10.0.0.2:81\n%s", d, tr)
	}
}

func TestVerdicts(t *testing.T) {
	tests := []struct {
		name, chains string
		want         Verdict
		reject       string
		chain        string
	}{
		{"policy drop", `chain c { type filter hook input priority 0; policy drop; }`, VerdictDrop, "", "c"},
		{"policy accept", `chain c { type filter hook input priority 0; policy accept; }`, VerdictAccept, "", ""},
		{"return in base chain applies policy", `chain c { type filter hook input priority 0; policy drop; return; accept }`, VerdictDrop, "", "c"},
		{"jump then return continues", `chain c { type filter hook input priority 0; jump a; drop }
			chain a { return; accept }`, VerdictDrop, "", "c"},
		{"end of jumped chain continues", `chain c { type filter hook input priority 0; jump a; drop }
			chain a { }`, VerdictDrop, "", "c"},
		{"accept in a jumped chain ends the base chain", `chain c { type filter hook input priority 0; jump a; drop }
			chain a { accept }`, VerdictAccept, "", ""},
		{"goto does not come back", `chain c { type filter hook input priority 0; goto a; drop }
			chain a { }`, VerdictAccept, "", ""},
		{"goto from a jumped chain returns to the jumper's caller", `chain c { type filter hook input priority 0; jump a; drop }
			chain a { goto b; accept }
			chain b { }`, VerdictDrop, "", "c"},
		{"continue", `chain c { type filter hook input priority 0; continue; drop }`, VerdictDrop, "", "c"},
		{"vmap continue", `chain c { type filter hook input priority 0; tcp dport vmap { 22 : continue, 23 : accept }; drop }`, VerdictDrop, "", "c"},
		{"vmap jump", `chain c { type filter hook input priority 0; tcp dport vmap { 22 : jump a }; accept }
			chain a { drop }`, VerdictDrop, "", "a"},
		{"vmap miss", `chain c { type filter hook input priority 0; tcp dport vmap { 23 : drop }; accept }`, VerdictAccept, "", ""},
		{"reject", `chain c { type filter hook input priority 0; reject }`, VerdictReject, "", "c"},
		{"reject tcp reset", `chain c { type filter hook input priority 0; reject with tcp reset }`, VerdictReject, "tcp reset", "c"},
		{"reject icmp", `chain c { type filter hook input priority 0; reject with icmp type host-unreachable }`, VerdictReject, "icmp host-unreachable", "c"},
		{"reject icmpx", `chain c { type filter hook input priority 0; reject with icmpx admin-prohibited }`, VerdictReject, "icmpx admin-prohibited", "c"},
		{"accept then the next base chain", `chain c { type filter hook input priority 0; accept }
			chain d { type filter hook input priority 10; drop }`, VerdictDrop, "", "d"},
		{"priorities order chains", `chain late { type filter hook input priority filter + 10; mark 0x1 drop }
			chain early { type filter hook input priority filter - 10; mark set 0x1 }`, VerdictDrop, "", "late"},
		{"priorities order chains (swapped)", `chain late { type filter hook input priority 10; mark set 0x1 }
			chain early { type filter hook input priority -10; mark 0x1 drop }`, VerdictAccept, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, "table inet t {\n"+tt.chains+"\n}")
			tr := mustTrace(t, p, "tcp 1.1.1.1:1 -> 192.168.0.2:22 iif eth0", testEnv)
			o := tr.Branches[0].Outcome
			if o.Verdict != tt.want || o.Reject != tt.reject || o.Chain != tt.chain {
				t.Errorf("got %s %q in chain %q, want %s %q in %q\n%s", o.Verdict, o.Reject, o.Chain, tt.want, tt.reject, tt.chain, tr)
			}
			if tt.want != VerdictAccept && o.Hook != HookInput {
				t.Errorf("decided at hook %q, want input", o.Hook)
			}
		})
	}
}

func TestSetUpdates(t *testing.T) {
	src := `table ip t {
		set seen { type ipv4_addr; flags dynamic,timeout; timeout 1m; }
		set once { type ipv4_addr; flags dynamic,timeout; timeout 1m; }
		set gone { type ipv4_addr; elements = { 1.1.1.1 } }
		chain c { type filter hook prerouting priority 0; policy accept;
			tcp dport 1 update @seen { ip saddr }
			tcp dport 2 add @once { ip saddr }
			tcp dport 3 delete @gone { ip saddr }
			tcp dport 4 update @seen { ip saddr timeout 5m }
			ip saddr @seen meta mark set meta mark | 0x1
			ip saddr @once meta mark set meta mark | 0x2
			ip saddr @gone meta mark set meta mark | 0x4
		}
	}`
	clock := NewManualClock(time.Unix(1000, 0))
	env := testEnv
	env.Clock = clock
	rt := NewRuntime(mustCompile(t, src), env)
	mark := func(port string) uint32 {
		t.Helper()
		tr, err := rt.Trace(packet.MustParse("tcp 1.1.1.1:9 -> 2.2.2.2:" + port + " iif eth0"))
		if err != nil {
			t.Fatal(err)
		}
		return tr.Branches[0].Outcome.Packet.Mark
	}
	// An update is visible to later rules of the same packet.
	if m := mark("1"); m != 0x5 {
		t.Fatalf("after update: mark %#x, want 0x5", m)
	}
	if m := mark("2"); m != 0x7 {
		t.Fatalf("after add: mark %#x, want 0x7", m)
	}
	clock.Advance(50 * time.Second)
	mark("1") // refreshes @seen
	mark("2") // add does not refresh @once
	clock.Advance(20 * time.Second)
	if m := mark("9"); m != 0x5 {
		t.Fatalf("70s later: mark %#x, want 0x5 (@once expired, @seen refreshed)", m)
	}
	if got := rt.SetElements("ip t", "seen"); len(got) != 1 || got[0] != "1.1.1.1" {
		t.Fatalf("SetElements(seen) = %v", got)
	}
	if m := mark("3"); m != 0x1 {
		t.Fatalf("after delete: mark %#x, want 0x1", m)
	}
	mark("4") // 5 minute timeout on this element
	clock.Advance(4 * time.Minute)
	if m := mark("9"); m != 0x1 {
		t.Fatalf("element timeout overrides the set's: mark %#x, want 0x1", m)
	}
	clock.Advance(2 * time.Minute)
	if m := mark("9"); m != 0 {
		t.Fatalf("all expired: mark %#x, want 0", m)
	}
	// A stateless Program.Trace commits nothing.
	p := mustCompile(t, src)
	p.Trace(packet.MustParse("tcp 1.1.1.1:9 -> 2.2.2.2:1 iif eth0"), env)
	if tr := mustTrace(t, p, "tcp 1.1.1.1:9 -> 2.2.2.2:9 iif eth0", env); tr.Branches[0].Outcome.Packet.Mark != 0x4 || tr.Committed != -1 {
		t.Fatalf("Program.Trace leaked state:\n%s", tr)
	}
}

func TestListedElementTimeouts(t *testing.T) {
	// Elements listed with "expires" live that much longer on the runtime's clock.
	p := mustCompile(t, `table ip t {
		set s { type ipv4_addr; flags timeout; timeout 3h; elements = { 1.1.1.1 timeout 3h expires 10m, 1.1.1.2 } }
		chain c { type filter hook prerouting priority 0; ip saddr @s drop }
	}`)
	clock := NewManualClock(time.Unix(0, 0))
	env := testEnv
	env.Clock = clock
	rt := NewRuntime(p, env)
	v := func(src string) Verdict {
		tr, err := rt.Trace(packet.MustParse("tcp " + src + ":1 -> 2.2.2.2:2 iif eth0"))
		if err != nil {
			t.Fatal(err)
		}
		vv, _ := tr.Verdict()
		return vv
	}
	if v("1.1.1.1") != VerdictDrop || v("1.1.1.2") != VerdictDrop {
		t.Fatal("elements missing at start")
	}
	clock.Advance(11 * time.Minute)
	if v("1.1.1.1") != VerdictAccept || v("1.1.1.2") != VerdictDrop {
		t.Fatal("expired element still present, or the other one gone")
	}
}

func TestLocallyGeneratedAndLoopback(t *testing.T) {
	p := mustCompile(t, `table ip t {
		chain out { type filter hook output priority 0; meta mark set meta mark | 0x1 }
		chain post { type filter hook postrouting priority 0; oifname lo meta mark set meta mark | 0x2 }
		chain pre { type filter hook prerouting priority 0; iifname lo meta mark set meta mark | 0x4 }
		chain in { type filter hook input priority 0; meta mark set meta mark | 0x8 }
		chain fwd { type filter hook forward priority 0; meta mark set meta mark | 0x10 }
	}`)
	tests := []struct {
		pkt  string
		mark uint32
		d    Delivery
	}{
		{"tcp 192.168.0.2:1 -> 192.168.0.2:2", 0xf, DeliveryLocal},
		{"tcp 127.0.0.1:1 -> 127.0.0.1:2", 0xf, DeliveryLocal},
		{"tcp 192.168.0.2:1 -> 8.8.8.8:2", 0x1, DeliveryOut},
		{"tcp 192.168.0.2:1 -> 8.8.8.8:2 iif eth0", 0x10, DeliveryForward},
		{"tcp 8.8.8.8:1 -> 192.168.0.2:2 iif eth0", 0x8, DeliveryLocal},
		{"tcp 8.8.8.8:1 -> 192.168.0.2:2", 0x8, DeliveryLocal},
	}
	for _, tt := range tests {
		tr := mustTrace(t, p, tt.pkt, testEnv)
		o := tr.Branches[0].Outcome
		if o.Packet.Mark != tt.mark || o.Delivery != tt.d {
			t.Errorf("%s: mark %#x delivery %s, want %#x %s\n%s", tt.pkt, o.Packet.Mark, o.Delivery, tt.mark, tt.d, tr)
		}
	}
}

func TestTraceRendering(t *testing.T) {
	progs := loadGolden(t, "nftproxy")
	tr := mustTrace(t, progs["dump"], "tcp 10.1.0.5:40000 -> 172.30.0.41:80 iif veth-a", nodeEnv)
	s := tr.String()
	for _, want := range []string{
		"tcp 10.1.0.5:40000 -> 172.30.0.41:80 iif veth-a\n",
		"branch 1 of 2, probability 0.5\n",
		"  choice: numgen random mod 2 = 0 (ip nftproxy chain dnat-2 rule 0)\n",
		"  hook prerouting: packet tcp 10.1.0.5:40000 -> 172.30.0.41:80 iif veth-a\n",
		"    table ip nftproxy chain nat-prerouting (type nat hook prerouting priority -100)\n",
		"        [3] ip daddr . meta l4proto . th dport vmap @service-ips  -> goto dnat-2  (element 172.30.0.41 . tcp . 80 comment \"ns1/web/tcp/http\" : goto dnat-2 in @service-ips)\n",
		"      chain dnat-2 (goto)\n",
		"-> dnat to 10.1.0.5:8080  (numgen random mod 2 = 0 (1 of 2); element 172.30.0.41 . tcp . 80 . 0 : 10.1.0.5 . 8080 in @backends)\n",
		"    nat: destination 172.30.0.41:80 translated to 10.1.0.5:8080\n",
		"  routing: 10.1.0.5 is not a local address: forward via cni0\n",
		"  => accept, forwarded: tcp 192.168.0.2:40000 -> 10.1.0.5:8080 iif veth-a oif cni0 (dnat, masquerade to 192.168.0.2)\n",
		"endpoints:\n  0.5 accept forward 10.1.0.5:8080\n  0.5 accept forward 10.2.0.6:8080\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("rendering lacks %q:\n%s", want, s)
		}
	}
	// Every step of a branch is recorded, with the rule text and the deciding
	// expression.
	var sawVmap, sawMiss bool
	for _, st := range tr.Branches[0].Steps {
		if st.Kind == StepRule && st.Chain == "services" && st.Rule == 3 {
			sawVmap = st.Matched && st.Verdict == "goto dnat-2" && st.Expr == "ip daddr . meta l4proto . th dport vmap @service-ips" && st.Hook == HookPrerouting
		}
		if st.Kind == StepRule && st.Chain == "services" && st.Rule == 0 {
			sawMiss = !st.Matched && st.Expr == "ip saddr != 10.0.0.0/8"
		}
	}
	if !sawVmap || !sawMiss {
		t.Errorf("steps lack the service-ips vmap (%v) or the failed cluster CIDR match (%v)", sawVmap, sawMiss)
	}
	tr = mustTrace(t, progs["dump"], "tcp 10.1.0.5:40000 -> 172.30.0.50:80 iif veth-a", nodeEnv)
	if s := tr.String(); !strings.Contains(s, "  => reject at hook forward, table ip nftproxy chain reject-chain rule 0\n") {
		t.Errorf("reject rendering:\n%s", s)
	}
}

func TestDormantTable(t *testing.T) {
	src := "add table ip t { flags dormant ; }\nadd chain ip t c { type filter hook input priority 0 ; policy drop ; }\n"
	tr := mustTrace(t, mustCompile(t, src), "tcp 1.1.1.1:1 -> 192.168.0.2:2 iif eth0", testEnv)
	if v, _ := tr.Verdict(); v != VerdictAccept {
		t.Errorf("a dormant table dropped the packet:\n%s", tr)
	}
	tr = mustTrace(t, mustCompile(t, strings.Replace(src, "flags dormant", "comment \"x\"", 1)), "tcp 1.1.1.1:1 -> 192.168.0.2:2 iif eth0", testEnv)
	if v, _ := tr.Verdict(); v != VerdictDrop {
		t.Errorf("an active table did not drop the packet:\n%s", tr)
	}
}

func TestListingWithHandles(t *testing.T) {
	p := mustCompile(t, "table ip t { # handle 1\n\tchain c { # handle 2\n\t\ttype filter hook input priority filter; policy drop;\n\t\ttcp dport 22 accept # handle 3\n\t}\n}\n")
	if v, _ := mustTrace(t, p, "tcp 1.1.1.1:1 -> 192.168.0.2:22 iif eth0", testEnv).Verdict(); v != VerdictAccept {
		t.Error("port 22 not accepted")
	}
	if v, _ := mustTrace(t, p, "tcp 1.1.1.1:1 -> 192.168.0.2:23 iif eth0", testEnv).Verdict(); v != VerdictDrop {
		t.Error("port 23 not dropped")
	}
}
