package sim

import (
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		src string
		// expected CompileError fields; Rule -2 means "don't care"
		table, chain, set string
		rule              int
		ruleText          string
		line, col         int
		msg               string
	}{
		{"add table ip t\nadd chain ip t c\nadd rule ip t c ip id 64 drop\n", "ip t", "c", "", 0, "ip id 64 drop", 3, 4,
			`unsupported ip field "id" (supported: saddr, daddr, protocol, ttl, dscp, length, version, frag-off)`},
		{"add table ip t\nadd chain ip t c\nadd rule ip t c accept\nadd rule ip t c tcp dport 80 ip saddr 1.2.3.4 tcp window 5 drop\n", "ip t", "c", "", 1,
			"tcp dport 80 ip saddr 1.2.3.4 tcp window 5 drop", 4, 35, `unsupported tcp field "window" (supported: sport, dport, flags)`},
		{"table ip t {\n chain c {\n  accept\n  limit rate 10/second accept\n }\n}", "ip t", "c", "", 1, "limit rate 10/second accept", 4, 1, `limit rate depends on the rate of earlier packets, which a packet cannot show (CompileOptions.Forks follows both outcomes)`},
		{"table ip t { chain c { jump nowhere } }", "ip t", "c", "", 0, "jump nowhere", 1, 6, `no such chain "nowhere"`},
		{"table ip t { chain c { ip daddr @missing drop } }", "ip t", "c", "", 0, "ip daddr @missing drop", 1, 10, `no such set or map "missing" in table ip t`},
		{"table ip t { chain c { ip saddr 10.0.0.300 drop } }", "ip t", "c", "", 0, "ip saddr 10.0.0.300 drop", 1, 10, `bad ipv4_addr value "10.0.0.300"`},
		{"table ip t { set s { type ipv4_addr; }\n chain c { ip daddr . tcp dport @s drop } }", "ip t", "c", "", 0, "ip daddr . tcp dport @s drop", 2, 22,
			"datatype mismatch: @s has key ipv4_addr, expression has ipv4_addr . inet_service"},
		{"table ip t { set s { type ipv4_addr; elements = { 10.0.0.0/8 } } }", "ip t", "", "s", -1, "", 1, 51, `@s needs "flags interval" for the range "10.0.0.0/8"`},
		{"table ip t { chain a { jump b }\n chain b { goto a } }", "ip t", "a", "", -1, "", 0, 0, "chain loop: a -> b -> a"},
		{"table ip t { chain c { type filter hook prerouting priority 0; dnat to 1.1.1.1 } }", "ip t", "c", "", 0, "dnat to 1.1.1.1", 1, 0,
			"dnat in a filter chain (reached from base chain c); NAT needs a nat chain"},
		{"table ip t { chain c { type nat hook prerouting priority 0; jump m }\n chain m { masquerade } }", "ip t", "m", "", 0, "masquerade", 2, 0,
			"masquerade at hook prerouting (reached from base chain c); only postrouting and input"},
		{"table ip t { chain c { ", "ip t", "c", "", -1, "", 1, 24, `expected "}", found end of input`},
		{"frob ip t", "", "", "", -1, "", 1, 1, `unsupported command "frob"`},
		{"table netdev t { chain c { type filter hook prerouting priority 0; } }", "netdev t", "c", "", -1, "", 1, 45, `hook "prerouting" is not supported in family netdev`},
		{"table ip t { chain c { type frob hook input priority 0; } }", "ip t", "c", "", -1, "", 1, 29, `unknown chain type "frob"`},
		{"table ip t { chain c { type filter hook ingress priority 0; } }", "ip t", "c", "", -1, "", 1, 41, `hook "ingress" is not supported in family ip`},
		{"table ip t { chain c { type filter hook input priority 0; }\n chain d { jump c } }", "ip t", "d", "", 0, "jump c", 2, 6, `cannot jump to base chain "c"`},
		{"table ip t { chain c { ip saddr $foo } }", "ip t", "c", "", 0, "ip saddr $foo", 1, 10, "variables ($foo) are not supported"},
		{"table ip t { chain c { meta ibrname br0 accept } }", "ip t", "c", "", 0, "meta ibrname br0 accept", 1, 6, `unsupported meta key "ibrname"`},
		{"table ip t { chain c { osf name \"Linux\" accept } }", "ip t", "c", "", 0, `osf name "Linux" accept`, 1, 1, `osf depends on the operating system's fingerprint in the SYN, which a packet cannot show (CompileOptions.Forks follows both outcomes)`},
		{"table ip t { chain c { ipsec in reqid 1 accept } }", "ip t", "c", "", 0, `ipsec in reqid 1 accept`, 1, 1, `unsupported expression "ipsec"`},
		{"table ip t { chain c { ip saddr } }", "ip t", "c", "", 0, "ip saddr", 1, 10, "ip saddr: missing value to compare with"},
		{"table ip t { chain c { ip saddr 1.1.1.1 frob } }", "ip t", "c", "", 0, "ip saddr 1.1.1.1 frob", 1, 18, `unknown expression "frob"`},
		{`table ip t { chain c { comment "x } }`, "ip t", "c", "", -1, "", 1, 32, "unterminated string"},
		{"add rule ip t c accept", "", "", "", -1, "", 1, 13, "no such table ip t"},
		{"table ip t { map m { type ipv4_addr : verdict; elements = { 1.1.1.1 : goto nowhere } } }", "ip t", "", "m", -1, "", 1, 76, `no such chain "nowhere"`},
		{"table ip t { chain c { type filter hook input priority bogus; } }", "ip t", "c", "", -1, "", 1, 56, `bad priority "bogus": unknown priority "bogus"`},
		{"table ip t { chain c { ct state foo } }", "ip t", "c", "", 0, "ct state foo", 1, 10, `bad ct_state value "foo"`},
		{"table ip t { chain c { tcp dport 1-70000 } }", "ip t", "c", "", 0, "tcp dport 1-70000", 1, 11, `bad inet_service value "1-70000"`},
		{"table ip t { chain c { ip saddr 1.1.1.1 . 2.2.2.2 } }", "ip t", "c", "", 0, "ip saddr 1.1.1.1 . 2.2.2.2", 1, 18, `unknown expression "."`},
		{"table ip t { chain c { ip saddr . ip daddr { 1.1.1.1 } } }", "ip t", "c", "", 0, "ip saddr . ip daddr { 1.1.1.1 }", 1, 31,
			`expected "." and 1 more key fields (key is ipv4_addr . ipv4_addr), found end of element`},
		{"table ip t { map m { type ipv4_addr : ipv4_addr; }\n chain c { ip saddr vmap @m } }", "ip t", "c", "", 0, "ip saddr vmap @m", 2, 15, "@m is not a verdict map"},
		{"table ip t { chain c { type nat hook prerouting priority 0; dnat to 1.1.1.1-1.1.1.5 } }", "ip t", "c", "", 0, "dnat to 1.1.1.1-1.1.1.5", 1, 9,
			"address ranges in dnat are not supported"},
		{"table ip t { chain c { ip6 saddr ::1 } }", "ip t", "c", "", 0, "ip6 saddr ::1", 1, 1, "ip6 saddr in an ip table"},
		{"table ip t { chain c { fib daddr mark eth0 } }", "ip t", "c", "", 0, "fib daddr mark eth0", 1, 11, `expected type, oif or oifname in fib expression, found "mark"`},
		{"table ip t { chain c { numgen random mod 0 vmap { 0 : drop } } }", "ip t", "c", "", 0, "numgen random mod 0 vmap { 0 : drop }", 1, 19, `bad numgen modulus "0"`},
		{"table ip t { set s { type ipv4_addr; }\n chain c { update @s { tcp dport } } }", "ip t", "c", "", 0, "update @s { tcp dport }", 2, 8,
			"datatype mismatch: @s has key ipv4_addr, expression has inet_service"},
		{"table ip t { set s { type ipv4_addr; }\n delete set ip t s }", "", "", "", -1, "", 2, 2, `table ip t: unsupported object "delete"`},
		{"add table ip t\nadd set ip t s { type ipv4_addr ; }\nadd chain ip t c\nadd rule ip t c ip saddr @s\ndelete set ip t s\n", "ip t", "c", "", 0, "ip saddr @s", 4, 10,
			`set "s" was deleted while in use`},
		// Map updates from the packet path: the data is checked against the map's data
		// type, field by field.
		{"table ip t { map m { type ipv4_addr : ipv4_addr . inet_service; }\n chain c { update @m { ip saddr : th dport . ip daddr } } }", "ip t", "c", "", 0, "update @m { ip saddr : th dport . ip daddr }", 2, 24,
			"datatype mismatch: @m has data ipv4_addr . inet_service, expression has inet_service . ipv4_addr"},
		{"table ip t { map m { type ipv4_addr : ipv4_addr . inet_service; }\n chain c { update @m { ip saddr : 10.1.0.500 . 80 } } }", "ip t", "c", "", 0, "update @m { ip saddr : 10.1.0.500 . 80 }", 2, 24,
			`bad ipv4_addr value "10.1.0.500"`},
		{"table ip t { map m { type ipv4_addr : ipv4_addr . inet_service; }\n chain c { update @m { ip saddr } } }", "ip t", "c", "", 0, "update @m { ip saddr }", 2, 22,
			`@m is a map: update needs ": DATA" after the key (data is ipv4_addr . inet_service)`},
		{"table ip t { map m { type ipv4_addr : ipv4_addr . inet_service; }\n chain c { delete @m { ip saddr } } }", "ip t", "c", "", 0, "delete @m { ip saddr }", 2, 22,
			`@m is a map: delete needs ": DATA" after the key (data is ipv4_addr . inet_service)`},
		{"table ip6 t { map m { type ipv6_addr . ipv6_addr : ipv6_addr . inet_service; }\n chain c { update @m { ip6 saddr . ip6 daddr : ip6 daddr } } }", "ip6 t", "c", "", 0,
			"update @m { ip6 saddr . ip6 daddr : ip6 daddr }", 2, 37, "datatype mismatch: @m has data ipv6_addr . inet_service, expression has ipv6_addr"},
		{"table ip t { map v { type ipv4_addr : verdict; }\n chain c { update @v { ip saddr : accept } } }", "ip t", "c", "", 0, "update @v { ip saddr : accept }", 2, 8,
			"@v is a verdict map; verdict maps cannot be updated from the packet path"},
		{"table ip t { set s { type ipv4_addr; }\n chain c { add @s { ip saddr : ip daddr } } }", "ip t", "c", "", 0, "add @s { ip saddr : ip daddr }", 2, 19,
			"@s is a set; its elements have no data (use a map)"},
		// ct proto-src and proto-dst have a type only after the rule established a
		// protocol with ports, as in nft.
		{"table ip t { set s { type ipv4_addr . inet_service; }\n chain c { ip daddr . ct original proto-dst @s } }", "ip t", "c", "", 0, "ip daddr . ct original proto-dst @s", 2, 12,
			`ct original proto-dst has no type without a transport protocol: match "meta l4proto tcp" (or udp, sctp) earlier in the rule`},
		{"table ip t { chain c { meta l4proto { tcp, udp } ct original proto-dst 80 } }", "ip t", "c", "", 0, "meta l4proto { tcp, udp } ct original proto-dst 80", 1, 27,
			`ct original proto-dst has no type without a transport protocol: match "meta l4proto tcp" (or udp, sctp) earlier in the rule`},
		{"table ip t { chain c { meta l4proto icmp ct original proto-dst 1 } }", "ip t", "c", "", 0, "meta l4proto icmp ct original proto-dst 1", 1, 19,
			"ct original proto-dst: protocol icmp has no ports"},
	}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			_, err := CompileText(tt.src)
			var ce *CompileError
			if !errors.As(err, &ce) {
				t.Fatalf("CompileText error = %v, want a *CompileError", err)
			}
			if ce.Table != tt.table || ce.Chain != tt.chain || ce.Set != tt.set || ce.Rule != tt.rule ||
				ce.RuleText != tt.ruleText || ce.Line != tt.line || ce.Column != tt.col || ce.Msg != tt.msg {
				t.Errorf("got  table %q chain %q set %q rule %d %q line %d col %d msg %q\nwant table %q chain %q set %q rule %d %q line %d col %d msg %q\n(%v)",
					ce.Table, ce.Chain, ce.Set, ce.Rule, ce.RuleText, ce.Line, ce.Column, ce.Msg,
					tt.table, tt.chain, tt.set, tt.rule, tt.ruleText, tt.line, tt.col, tt.msg, err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Error() = %q lacks the message", err)
			}
		})
	}
}

func TestCompileErrorText(t *testing.T) {
	_, err := CompileText("add table ip t\nadd chain ip t c\nadd rule ip t c ip id 64 drop\n")
	want := `table ip t chain c rule 0 "ip id 64 drop": line 3 column 4: unsupported ip field "id" (supported: saddr, daddr, protocol, ttl, dscp, length, version, frag-off)`
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v\nwant %s", err, want)
	}
}

func TestCompileFakeWrapsErrors(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, "t")
	tx := fake.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "c"})
	tx.Add(&knftables.Rule{Chain: "c", Rule: "ip id 64 drop"})
	if err := fake.Run(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	_, err := CompileFake(fake)
	var ce *CompileError
	if !errors.As(err, &ce) || ce.Chain != "c" || ce.Column != 4 || !strings.HasPrefix(err.Error(), "compile fake dump: ") {
		t.Fatalf("CompileFake error = %v", err)
	}
	if _, err := CompileFake(nil); err == nil {
		t.Fatal("CompileFake(nil) succeeded")
	}
}

func TestScriptCommands(t *testing.T) {
	// A knftables transaction script: flush, delete, insert, index positions.
	p := mustCompile(t, `
add table ip t
add chain ip t c { type filter hook input priority 0 ; policy accept ; }
add chain ip t gone
add set ip t s { type ipv4_addr ; }
add rule ip t c tcp dport 1 meta mark set 0x1
add rule ip t c tcp dport 1 meta mark set meta mark | 0x4
insert rule ip t c tcp dport 1 meta mark set 0x2
add rule ip t c index 0 tcp dport 1 meta mark set meta mark | 0x8
add element ip t s { 1.1.1.1, 2.2.2.2 }
delete element ip t s { 2.2.2.2 }
destroy element ip t s { 3.3.3.3 }
add rule ip t c ip saddr @s meta mark set meta mark | 0x10
delete chain ip t gone
flush set ip t s
add element ip t s { 2.2.2.2 }
create table ip x
delete table ip x
destroy table ip nope
`)
	// Rules in order: mark=2, |8, =1, |4, saddr @s |0x10.
	tr := mustTrace(t, p, "tcp 2.2.2.2:9 -> 192.168.0.2:1 iif eth0", testEnv)
	if m := tr.Branches[0].Outcome.Packet.Mark; m != 0x15 {
		t.Errorf("mark %#x, want 0x15\n%s", m, tr)
	}
	tr = mustTrace(t, p, "tcp 1.1.1.1:9 -> 192.168.0.2:1 iif eth0", testEnv)
	if m := tr.Branches[0].Outcome.Packet.Mark; m != 0x5 {
		t.Errorf("mark %#x, want 0x5\n%s", m, tr)
	}
	if got := strings.Join(p.Tables(), ","); got != "ip t" {
		t.Errorf("Tables() = %s", got)
	}
	p = mustCompile(t, "add table ip t\nadd chain ip t c\nadd rule ip t c accept\nflush ruleset\nadd table ip u\n")
	if got := strings.Join(p.Tables(), ","); got != "ip u" {
		t.Errorf("after flush ruleset Tables() = %s", got)
	}

	// Flushing chains, tables and maps; named counters are accepted and ignored.
	p = mustCompile(t, `
table ip t {
	counter c2 { packets 1 bytes 2 }
	map m { type inet_service : mark; elements = { 1 : 0x1 } }
	chain c { type filter hook input priority 0; drop }
	chain d { type filter hook input priority 1; meta mark set tcp dport map @m }
}
add counter ip t c1 { packets 0 bytes 0 ; }
flush chain ip t c
add rule ip t c meta mark set 0x10
flush map ip t m
add element ip t m { 1 : 0x2 }
`)
	tr = mustTrace(t, p, "tcp 2.2.2.2:9 -> 192.168.0.2:1 iif eth0", testEnv)
	if v, _ := tr.Verdict(); v != VerdictAccept || tr.Branches[0].Outcome.Packet.Mark != 0x2 {
		t.Errorf("after flushes: %s mark %#x\n%s", v, tr.Branches[0].Outcome.Packet.Mark, tr)
	}
	p = mustCompile(t, "add table ip t\nadd chain ip t c { type filter hook input priority 0 ; }\nadd rule ip t c drop\nflush table ip t\n")
	if v, _ := mustTrace(t, p, "tcp 2.2.2.2:9 -> 192.168.0.2:1 iif eth0", testEnv).Verdict(); v != VerdictAccept {
		t.Errorf("flush table left rules behind")
	}
}
