package packet

import (
	"errors"
	"net/netip"
	"testing"
)

func TestParse(t *testing.T) {
	ap := netip.MustParseAddrPort
	a0 := func(s string) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(s), 0) }
	tests := []struct {
		in   string
		want Packet
		out  string // canonical String(); "" means same as in
	}{
		{
			in:   "tcp 10.0.0.5:40000 -> 172.30.0.41:80 iif eth0",
			want: Packet{Protocol: TCP, Src: ap("10.0.0.5:40000"), Dst: ap("172.30.0.41:80"), IIf: "eth0"},
		},
		{
			in:   "udp [fd00::5]:53000 -> [fd00::10]:53",
			want: Packet{Protocol: UDP, Src: ap("[fd00::5]:53000"), Dst: ap("[fd00::10]:53")},
		},
		{
			in:   "sctp 1.2.3.4:1 -> 5.6.7.8:2 iif veth1 oif eth0 mark 0x4000 ct established",
			want: Packet{Protocol: SCTP, Src: ap("1.2.3.4:1"), Dst: ap("5.6.7.8:2"), IIf: "veth1", OIf: "eth0", Mark: 0x4000, CT: CTEstablished},
		},
		{
			in:   "tcp 1.2.3.4:1 -> 5.6.7.8:2 ct related mark 16 oif lo",
			want: Packet{Protocol: TCP, Src: ap("1.2.3.4:1"), Dst: ap("5.6.7.8:2"), OIf: "lo", Mark: 16, CT: CTRelated},
			out:  "tcp 1.2.3.4:1 -> 5.6.7.8:2 oif lo mark 0x10 ct related",
		},
		{
			in:   "tcp 1.2.3.4:1 -> 5.6.7.8:2 flags ack,syn ct established",
			want: Packet{Protocol: TCP, Src: ap("1.2.3.4:1"), Dst: ap("5.6.7.8:2"), CT: CTEstablished, Flags: FlagSYN | FlagACK},
			out:  "tcp 1.2.3.4:1 -> 5.6.7.8:2 ct established flags syn,ack",
		},
		{
			in:   "icmpv6 fe80::1 -> ff02::1 iif eth0 type nd-router-advert",
			want: Packet{Protocol: ICMPv6, Src: a0("fe80::1"), Dst: a0("ff02::1"), IIf: "eth0", ICMP: ICMPMessage{Set: true, Type: 134}},
		},
		{
			in:   "icmp 1.2.3.4 -> 5.6.7.8 type 3 code port-unreachable",
			want: Packet{Protocol: ICMP, Src: a0("1.2.3.4"), Dst: a0("5.6.7.8"), ICMP: ICMPMessage{Set: true, Type: 3, Code: 3}},
			out:  "icmp 1.2.3.4 -> 5.6.7.8 type destination-unreachable code 3",
		},
		{
			in:   "tcp 1.2.3.4:1 -> 5.6.7.8:2 ct new",
			want: Packet{Protocol: TCP, Src: ap("1.2.3.4:1"), Dst: ap("5.6.7.8:2")},
			out:  "tcp 1.2.3.4:1 -> 5.6.7.8:2",
		},
		{
			in:   "icmp 10.0.0.5 -> 10.0.0.1 ct untracked",
			want: Packet{Protocol: ICMP, Src: a0("10.0.0.5"), Dst: a0("10.0.0.1"), CT: CTUntracked},
		},
		{
			in:   "icmpv6 [fd00::5] -> fd00::1 ct invalid",
			want: Packet{Protocol: ICMPv6, Src: a0("fd00::5"), Dst: a0("fd00::1"), CT: CTInvalid},
			out:  "icmpv6 fd00::5 -> fd00::1 ct invalid",
		},
		{
			in:   "  tcp\t1.2.3.4:0   ->  5.6.7.8:65535  ",
			want: Packet{Protocol: TCP, Src: ap("1.2.3.4:0"), Dst: ap("5.6.7.8:65535")},
			out:  "tcp 1.2.3.4:0 -> 5.6.7.8:65535",
		},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got != tt.want {
				t.Fatalf("Parse = %#v, want %#v", got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			want := tt.out
			if want == "" {
				want = tt.in
			}
			if s := got.String(); s != want {
				t.Fatalf("String = %q, want %q", s, want)
			}
			again, err := Parse(got.String())
			if err != nil || again != got {
				t.Fatalf("round trip: %v, %#v", err, again)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		in      string
		col     int
		tok     string
		wantMsg string
	}{
		{"tpc 1.2.3.4:1 -> 5.6.7.8:2", 1, "tpc", `column 1: unknown protocol "tpc"`},
		{"", 1, "", "column 1: empty packet, expected a protocol"},
		{"tcp", 4, "", "column 4: expected a source address, found end of input"},
		{"tcp 1.2.3.4 -> 5.6.7.8:2", 5, "1.2.3.4", `column 5: source "1.2.3.4": missing port (tcp needs ADDR:PORT)`},
		{"tcp 1.2.3.4:1 => 5.6.7.8:2", 15, "=>", `column 15: expected "->", found "=>"`},
		{"tcp 1.2.3.4:1", 14, "", `column 14: expected "->", found end of input`},
		{"tcp 1.2.3.4:1 ->", 17, "", "column 17: expected a destination address, found end of input"},
		{"tcp 1.2.3.4:1 -> 5.6.7:2", 18, "5.6.7:2", `column 18: destination "5.6.7:2": bad ADDR:PORT`},
		{"tcp 1.2.3.4:1 -> [fd00::1]:2", 18, "[fd00::1]:2", `column 18: destination "[fd00::1]:2" is not of the source's family`},
		{"tcp 1.2.3.4:99999 -> 5.6.7.8:2", 5, "1.2.3.4:99999", `column 5: source "1.2.3.4:99999": bad ADDR:PORT`},
		{"icmp 1.2.3.4:1 -> 5.6.7.8", 6, "1.2.3.4:1", `column 6: source "1.2.3.4:1": icmp has no ports`},
		{"icmp fd00::1 -> fd00::2", 1, "icmp", `column 1: protocol "icmp" needs IPv4 addresses (use icmpv6)`},
		{"icmpv6 1.2.3.4 -> 5.6.7.8", 1, "icmpv6", `column 1: protocol "icmpv6" needs IPv6 addresses (use icmp)`},
		{"tcp 1.2.3.4:1 -> 5.6.7.8:2 iff eth0", 28, "iff", `column 28: unknown attribute "iff" (want iif, oif, mark, ct, flags, type or code)`},
		{"udp 1.2.3.4:1 -> 5.6.7.8:2 flags syn", 28, "flags", `column 28: attribute "flags" is for tcp only`},
		{"tcp 1.2.3.4:1 -> 5.6.7.8:2 flags sin", 34, "sin", `column 34: bad tcp flags "sin" (want names such as syn,ack)`},
		{"icmp 1.2.3.4 -> 5.6.7.8 code 3", 25, "code", `column 25: attribute "code" needs a type before it`},
		{"icmpv6 fd00::1 -> fd00::2 type nd-router-advertisement", 32, "nd-router-advertisement", `column 32: unknown icmpv6 type "nd-router-advertisement"`},
		{"tcp 1.2.3.4:1 -> 5.6.7.8:2 type echo-request", 28, "type", `column 28: attribute "type" is for icmp and icmpv6 only`},
		{"tcp 1.2.3.4:1 -> 5.6.7.8:2 iif", 31, "", `column 31: attribute "iif" needs a value, found end of input`},
		{"tcp 1.2.3.4:1 -> 5.6.7.8:2 iif a iif b", 34, "iif", `column 34: attribute "iif" given twice`},
		{"tcp 1.2.3.4:1 -> 5.6.7.8:2 mark 0x1ffffffff", 33, "0x1ffffffff", `column 33: bad mark "0x1ffffffff" (want a 32-bit number)`},
		{"tcp 1.2.3.4:1 -> 5.6.7.8:2 ct estab", 31, "estab", `column 31: unknown conntrack state "estab"`},
		{"tcp 1.2.3.4:1 -> 5.6.7.8:2 iif abcdefghijklmnop", 32, "abcdefghijklmnop", `column 32: interface name "abcdefghijklmnop" is longer than 15 characters`},
		{"tcp [fe80::1%eth0]:1 -> [fe80::2]:2", 5, "[fe80::1%eth0]:1", `column 5: source "[fe80::1%eth0]:1": zones are not supported`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := Parse(tt.in)
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse(%q) error = %v, want *ParseError", tt.in, err)
			}
			if pe.Column != tt.col || pe.Token != tt.tok || pe.Error() != tt.wantMsg {
				t.Fatalf("Parse(%q) = column %d token %q %q; want column %d token %q %q",
					tt.in, pe.Column, pe.Token, pe.Error(), tt.col, tt.tok, tt.wantMsg)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ap := netip.MustParseAddrPort
	bad := []Packet{
		{},
		{Protocol: TCP, Src: ap("1.2.3.4:1")},
		{Protocol: TCP, Src: ap("1.2.3.4:1"), Dst: ap("[::1]:2")},
		{Protocol: 99, Src: ap("1.2.3.4:1"), Dst: ap("1.2.3.4:2")},
		{Protocol: ICMP, Src: ap("1.2.3.4:1"), Dst: ap("1.2.3.4:0")},
		{Protocol: ICMP, Src: ap("[::1]:0"), Dst: ap("[::2]:0")},
		{Protocol: TCP, Src: ap("1.2.3.4:1"), Dst: ap("1.2.3.4:2"), IIf: "a b"},
		{Protocol: TCP, Src: ap("1.2.3.4:1"), Dst: ap("1.2.3.4:2"), CT: 17},
	}
	for _, p := range bad {
		if err := p.Validate(); err == nil {
			t.Errorf("Validate(%#v) = nil, want an error", p)
		}
	}
	good := Packet{Protocol: UDP, Src: ap("[fd00::1]:1"), Dst: ap("[fd00::2]:2"), IIf: "eth0"}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate(%v) = %v", good, err)
	}
	if good.Family() != IPv6 || MustParse("tcp 1.1.1.1:1 -> 2.2.2.2:2").Family() != IPv4 {
		t.Errorf("Family wrong")
	}
}

func TestNames(t *testing.T) {
	if TCP.String() != "tcp" || Protocol(200).String() != "200" || ICMPv6.String() != "icmpv6" {
		t.Error("Protocol.String")
	}
	if CTUntracked.String() != "untracked" || CTState(9).String() != "ctstate(9)" {
		t.Error("CTState.String")
	}
	if IPv4.String() != "ip" || IPv6.String() != "ip6" {
		t.Error("Family.String")
	}
	if _, err := ParseProtocol("gre"); err == nil {
		t.Error("ParseProtocol(gre) should fail")
	}
	if !UDP.HasPorts() || ICMP.HasPorts() {
		t.Error("HasPorts")
	}
}
