package nftdata

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestProtocols(t *testing.T) {
	for name, want := range map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58, "ipv6-icmp": 58, "gre": 47} {
		if n, ok := ProtocolNumber(name); !ok || n != want {
			t.Errorf("ProtocolNumber(%q) = %d, %v; want %d", name, n, ok, want)
		}
	}
	if n, ok := ProtocolNumber("tpc"); ok {
		t.Errorf("ProtocolNumber(tpc) = %d; want none", n)
	}
	for n, want := range map[uint8]string{6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "ipv6-icmp", 253: "253"} {
		if got := ProtocolName(n); got != want {
			t.Errorf("ProtocolName(%d) = %q; want %q", n, got, want)
		}
	}
}

// TestLayoutRoundTrip checks the kernel's encoding of values (concatenated fields
// take 32-bit registers, marks are in host order) and that decoding gives nft's
// text back, the canonical form where the input was not.
func TestLayoutRoundTrip(t *testing.T) {
	mark := binary.NativeEndian.AppendUint32(nil, 0x4000)
	for _, tc := range []struct {
		typ    string
		fields []string
		hex    string
		text   []string // when decoding does not give fields back
	}{
		{"ipv4_addr . inet_proto . inet_service", []string{"10.0.0.1", "tcp", "80"}, "0a000001" + "06000000" + "00500000", nil},
		{"ipv4_addr . inet_proto . inet_service", []string{"10.0.0.1 . udp . 53"}, "0a000001" + "11000000" + "00350000", []string{"10.0.0.1", "udp", "53"}},
		{"inet_proto . inet_service", []string{"sctp", "30000"}, "84000000" + "75300000", nil},
		{"inet_proto . inet_service", []string{"47", "http"}, "2f000000" + "00500000", []string{"gre", "80"}},
		{"inet_proto", []string{"icmpv6"}, "3a", []string{"ipv6-icmp"}},
		{"inet_service", []string{"8080"}, "1f90", nil},
		{"ipv6_addr . ipv6_addr", []string{"fd00::1", "fd00::1"}, "fd000000000000000000000000000001" + "fd000000000000000000000000000001", nil},
		{"ipv6_addr . inet_service", []string{"2001:db8::", "443"}, "20010db8000000000000000000000000" + "01bb0000", nil},
		{"mark", []string{"0x00004000"}, hex.EncodeToString(mark), nil},
		{"ifname . ipv4_addr", []string{`eth0`, "192.0.2.1"}, "65746830000000000000000000000000" + "c0000201", []string{`"eth0"`, "192.0.2.1"}},
	} {
		l, err := ParseLayout(tc.typ)
		if err != nil {
			t.Fatalf("%s: %v", tc.typ, err)
		}
		b, err := l.Encode(nil, tc.fields)
		if err != nil {
			t.Fatalf("%s %q: %v", tc.typ, tc.fields, err)
		}
		if got := hex.EncodeToString(b); got != tc.hex || len(b) != l.Len() {
			t.Errorf("%s %q = %s (%d bytes); want %s (%d)", tc.typ, tc.fields, got, len(b), tc.hex, l.Len())
		}
		want := tc.text
		if want == nil {
			want = tc.fields
		}
		if got, err := l.Decode(b); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: decoding %s gave %q, %v; want %q", tc.typ, tc.hex, got, err, want)
		}
	}
}

// TestRangeRoundTrip checks ranges of concatenations, as an interval set stores
// them: prefixes, port ranges and interface wildcards come back as nft lists them.
func TestRangeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		typ          string
		fields, text []string
		lo, hi       string
	}{
		{"ipv4_addr . inet_proto . inet_service . ipv4_addr", []string{"203.0.113.1", "tcp", "80", "198.51.100.7/24"}, []string{"203.0.113.1", "tcp", "80", "198.51.100.0/24"},
			"cb007101" + "06000000" + "00500000" + "c6336400", "cb007101" + "06000000" + "00500000" + "c63364ff"},
		{"ipv6_addr . inet_service", []string{"2001:db8::/32", "1000-2000"}, nil,
			"20010db8000000000000000000000000" + "03e80000", "20010db8ffffffffffffffffffffffff" + "07d00000"},
		{"ipv4_addr", []string{"10.0.0.1-10.0.0.9"}, nil, "0a000001", "0a000009"},
		{"ifname", []string{"veth*"}, []string{`"veth*"`}, "76657468000000000000000000000000", "76657468ffffffffffffffffffffffff"},
		{"ipv4_addr", []string{"0.0.0.0/0"}, nil, "00000000", "ffffffff"},
	} {
		l, err := ParseLayout(tc.typ)
		if err != nil {
			t.Fatal(err)
		}
		lo, hi, err := l.EncodeRange(tc.fields)
		if err != nil {
			t.Fatalf("%s %q: %v", tc.typ, tc.fields, err)
		}
		if hex.EncodeToString(lo) != tc.lo || hex.EncodeToString(hi) != tc.hi {
			t.Errorf("%s %q = %x-%x; want %s-%s", tc.typ, tc.fields, lo, hi, tc.lo, tc.hi)
		}
		want := tc.text
		if want == nil {
			want = tc.fields
		}
		if got, err := l.DecodeRange(lo, hi); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: decoding %x-%x gave %q, %v; want %q", tc.typ, lo, hi, got, err, want)
		}
	}
}

// TestFormat checks the text of values of the types rules compare with.
func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		t    *Type
		in   string
		want string
	}{
		{CTState, "established", "established"},
		{CTState, "10", "established,new"},
		{CTStatus, "48", "snat,dnat"},
		{Mark, "16", "0x00000010"},
		{InetService, "https", "443"},
		{EtherType, "0x86dd", "ip6"},
		{Boolean, "exists", "exists"},
	} {
		b, err := tc.t.Parse(tc.in)
		if err != nil {
			t.Fatalf("%s %q: %v", tc.t, tc.in, err)
		}
		if got := tc.t.Format(b); got != tc.want {
			t.Errorf("%s %q formats as %q; want %q", tc.t, tc.in, got, tc.want)
		}
	}
}

// TestErrors checks that bad values are refused with the field, its type and the
// text named.
func TestErrors(t *testing.T) {
	l, err := ParseLayout("ipv4_addr . inet_proto . inet_service")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		fields []string
		field  int
		want   string
	}{
		{[]string{"10.0.0.300", "tcp", "80"}, 0, `field 1 (ipv4_addr): bad ipv4_addr value "10.0.0.300"`},
		{[]string{"fd00::1", "tcp", "80"}, 0, `field 1 (ipv4_addr): bad ipv4_addr value "fd00::1"`},
		{[]string{"10.0.0.1", "tpc", "80"}, 1, `field 2 (inet_proto): bad inet_proto value "tpc"`},
		{[]string{"10.0.0.1", "256", "80"}, 1, `field 2 (inet_proto): bad inet_proto value "256"`},
		{[]string{"10.0.0.1", "tcp", "65536"}, 2, `field 3 (inet_service): bad inet_service value "65536"`},
		{[]string{"10.0.0.1", "tcp", "80-90"}, 2, `field 3 (inet_service): bad inet_service value "80-90"`},
		{[]string{"10.0.0.1", "tcp"}, -1, "2 fields where the type ipv4_addr . inet_proto . inet_service has 3"},
		{[]string{"10.0.0.1 . tcp . 80 . 1"}, -1, "4 fields where the type ipv4_addr . inet_proto . inet_service has 3"},
	} {
		_, err := l.Encode(nil, tc.fields)
		var fe *FieldError
		if err == nil || err.Error() != tc.want || errors.As(err, &fe) != (tc.field >= 0) || (fe != nil && fe.Field != tc.field) {
			t.Errorf("Encode(%q): error %v; want %q", tc.fields, err, tc.want)
		}
	}
	if _, _, err := l.EncodeRange([]string{"10.0.0.1", "tcp", "90-80"}); err == nil || !strings.Contains(err.Error(), `field 3 (inet_service): range "90-80" is empty`) {
		t.Errorf("EncodeRange of an empty range: %v", err)
	}
	for _, tc := range []struct {
		hex, want string
	}{
		{"0a000001" + "06000000", "8 bytes where the type ipv4_addr . inet_proto . inet_service takes 12"},
		{"0a000001" + "06000100" + "00500000", "field 2 (inet_proto): padding 000100 is not zero"},
	} {
		b, _ := hex.DecodeString(tc.hex)
		if _, err := l.Decode(b); err == nil || err.Error() != tc.want {
			t.Errorf("Decode(%s): error %v; want %q", tc.hex, err, tc.want)
		}
	}
	for typ, want := range map[string]string{
		"ipv4_addr . ether_addr":        `type "ipv4_addr . ether_addr": field 2 "ether_addr" is not a known data type`,
		"verdict":                       `type "verdict": a verdict is not a key`,
		"inet_service : verdict . mark": `type "verdict . mark": a verdict cannot be concatenated`,
	} {
		if _, _, err := ParseSetType(typ); err == nil || err.Error() != want {
			t.Errorf("ParseSetType(%q): error %v; want %q", typ, err, want)
		}
	}
	verdicts, _ := ParseLayout("verdict")
	if _, err := verdicts.Encode(nil, []string{"accept"}); err == nil {
		t.Error("a verdict was encoded as data")
	}
}
