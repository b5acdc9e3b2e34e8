package sim

import "testing"

// TestHeaderMatches covers the header and meta fields real node rulesets (firewalld,
// iptables-nft) match on, with the values a synthetic packet carries.
func TestHeaderMatches(t *testing.T) {
	const (
		syn   = "tcp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0"
		ack   = "tcp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0 ct established"
		ping  = "icmp 10.0.0.5 -> 1.1.1.1 iif eth0"
		ping6 = "icmpv6 fd00::5 -> fd00::9 iif eth0"
		udp6  = "udp [fd00::5]:1 -> [fd00::9]:2 iif eth0"
		bcast = "udp 10.0.0.5:1 -> 255.255.255.255:67 iif eth0"
		mcast = "udp 10.0.0.5:1 -> 224.0.0.251:5353 iif eth0"
		viaLo = "tcp 127.0.0.1:1 -> 127.0.0.1:2 iif lo"
	)
	tests := []struct {
		rule, pkt string
		want      bool
	}{
		// icmp and icmpv6
		{"icmp type echo-request", ping, true},
		{"icmp type echo-reply", ping, false},
		{"icmp type { destination-unreachable, echo-request }", ping, true},
		{"icmp type { destination-unreachable, time-exceeded }", ping, false},
		{"icmp type 8", ping, true},
		{"icmp type echo-request icmp code net-unreachable", ping, true},
		{"icmp code 0", ping, true},
		{"icmp code port-unreachable", ping, false},
		{"icmp type echo-request", syn, false},
		{"icmpv6 type echo-request", ping6, true},
		{"icmpv6 type { nd-router-advert, nd-neighbor-solicit }", ping6, false},
		{"icmpv6 type { echo-request, nd-neighbor-solicit }", ping6, true},
		{"icmpv6 type echo-request", ping, false},
		{"icmpv6 code no-route", ping6, true},
		{"icmpv6 type { nd-router-advert, nd-neighbor-solicit }", "icmpv6 fe80::1 -> ff02::1 iif eth0 type nd-router-advert", true},
		{"icmp type timestamp-request", "icmp 10.0.0.5 -> 1.1.1.1 iif eth0 type timestamp-request", true},
		{"icmp type destination-unreachable icmp code port-unreachable", "icmp 10.0.0.5 -> 1.1.1.1 iif eth0 type destination-unreachable code port-unreachable", true},
		{"icmp code port-unreachable", "icmp 10.0.0.5 -> 1.1.1.1 iif eth0 type destination-unreachable code host-unreachable", false},
		{"meta length 40", "icmp 10.0.0.5 -> 1.1.1.1 iif eth0 type timestamp-request", true},
		// tcp flags: a new connection's first packet is a SYN, later ones ACKs
		{"tcp flags syn", syn, true},
		{"tcp flags syn", ack, false},
		{"tcp flags ack", ack, true},
		{"tcp flags syn,ack", ack, true},
		{"tcp flags == syn", syn, true},
		{"tcp flags != syn", syn, false},
		{"tcp flags syn / fin,syn,rst,ack", syn, true},
		{"tcp flags syn / fin,syn,rst,ack", ack, false},
		{"tcp flags & (fin | syn | rst | ack) == syn", syn, true},
		{"tcp flags & (fin|syn|rst|ack) == syn", ack, false},
		{"tcp flags & (syn | ack) == ack", ack, true},
		{"tcp flags & (fin | syn | rst | ack) != syn", ack, true},
		{"tcp flags syn", ping, false},
		{"tcp flags rst", syn + " flags rst", true},
		{"tcp flags syn / fin,syn,rst,ack", syn + " flags syn,ack", false},
		{"tcp flags & (syn | ack) == syn | ack", syn + " flags syn,ack", true},
		{"meta length 52", syn + " flags rst", true},
		{"tcp flags ! fin,syn,rst,psh,ack,urg", syn, false},
		{"tcp flags ! fin,syn,rst,psh,ack,urg", syn + " flags ecn", true},
		{"pkttype broadcast", bcast, true},
		{"skuid 1000", syn, false},
		{"ip frag-off & 8191 != 0", syn, false},
		{"ip frag-off & 0x4000 != 0", syn, true},
		{"rt type 0", udp6, false},
		{"frag more-fragments 1", udp6, false},
		{"hbh nexthdr != 0", udp6, false},
		// meta
		{"meta pkttype host", syn, true},
		{"meta pkttype { broadcast, multicast }", syn, false},
		{"meta pkttype broadcast", bcast, true},
		{"meta pkttype multicast", mcast, true},
		{"meta pkttype unicast", mcast, false},
		{"meta iiftype ether", syn, true},
		{"meta iiftype loopback", viaLo, true},
		{"meta iiftype ether", viaLo, false},
		{"meta length 60", syn, true},
		{"meta length 52", ack, true},
		{"meta length 84", ping, true},
		{"meta length 100-200", syn, false},
		{"meta length < 100", syn, true},
		{"meta skuid 0", syn, false},
		{"meta skgid != 1000", syn, false},
		// ip and ip6 header fields
		{"ip ttl 64", syn, true},
		{"ip ttl < 2", syn, false},
		{"ip dscp cs0", syn, true},
		{"ip dscp { cs1, af41, ef }", syn, false},
		{"ip length 60", syn, true},
		{"ip length 84", ping, true},
		{"ip version 4", syn, true},
		{"ip6 hoplimit 64", udp6, true},
		{"ip6 hoplimit 255", udp6, false},
		{"ip6 version 6", udp6, true},
		{"ip6 length 8", udp6, true},
		{"ip ttl 64", udp6, false},
		// fib reverse path check against testEnv's routes (a default route via eth0)
		{"fib saddr . mark . iif oif missing", syn, false},
		{"fib saddr . iif oif exists", syn, true},
		{"fib saddr . mark . iif oif missing", viaLo, false},
		{"fib daddr oif missing", syn, false},
		{"fib daddr oif missing", "tcp 10.0.0.5:1 -> 192.168.0.2:22 iif eth0", true}, // a local route
		{"fib daddr . iif oif exists", "tcp 10.0.0.5:1 -> 10.1.0.7:80 iif eth0", false},
		{"fib daddr . iif oif exists", "tcp 10.1.0.5:1 -> 10.1.0.7:80 iif cni0", true},
		{"fib saddr oif missing", "tcp 192.168.0.2:1 -> 1.1.1.1:2 iif eth0", true}, // claims a node address
		{"fib saddr . iif oif missing", "tcp 10.1.0.5:1 -> 1.1.1.1:2 iif eth0", true},
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

// TestTTLAfterForwarding: the TTL a forwarded packet shows after routing is one less.
func TestTTLAfterForwarding(t *testing.T) {
	p := mustCompile(t, `table ip t {
	chain pre {
		type filter hook prerouting priority 0; policy accept;
		ip ttl 64 meta mark set 0x1
	}
	chain fwd {
		type filter hook forward priority 0; policy accept;
		mark 0x1 ip ttl 63 accept
		drop
	}
}`)
	tr := mustTrace(t, p, "tcp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0", testEnv)
	if v, _ := tr.Verdict(); v != VerdictAccept {
		t.Errorf("verdict %v, want accept:\n%s", v, tr)
	}
}

func TestHeaderStatements(t *testing.T) {
	p := mustCompile(t, `table ip t {
	chain pre {
		type filter hook prerouting priority 0; policy accept;
		ip dscp set af41 ip ttl set 5
		ip dscp af41 ip ttl 5 meta mark set 0x1
	}
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		mark 0x1 meta l4proto tcp masquerade to :1000-2000
	}
}`)
	for pkt, want := range map[string]string{
		"tcp 10.0.0.5:40000 -> 1.1.1.1:2 iif eth0": "192.168.0.2:1000",
		"tcp 10.0.0.5:1500 -> 1.1.1.1:2 iif eth0":  "192.168.0.2:1500",
	} {
		tr := mustTrace(t, p, pkt, testEnv)
		if got := tr.Branches[0].Outcome.Packet.Src.String(); got != want {
			t.Errorf("%s: source %s, want %s\n%s", pkt, got, want, tr)
		}
	}
}

// TestPathNeutralTarget: an xt target known to let packets go on is one assumption,
// not a fork.
func TestPathNeutralTarget(t *testing.T) {
	tr := mustTrace(t, forkProgram(t, `xt target "CHECKSUM" ip daddr 9.9.9.9`), "udp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0", testEnv)
	if len(tr.Branches) != 1 {
		t.Fatalf("want one branch:\n%s", tr)
	}
	if a := tr.Branches[0].Assumptions(); len(a) != 1 || a[0] != `xt target "CHECKSUM" lets the packet go on (it fills in checksums)` {
		t.Errorf("assumptions %q", a)
	}
	tr = mustTrace(t, forkProgram(t, "ether saddr 00:11:22:33:44:55"), "udp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0", testEnv)
	if len(tr.Branches) != 2 {
		t.Errorf("ether saddr: want a fork:\n%s", tr)
	}
}
