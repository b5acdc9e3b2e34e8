package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// dkind is the base kind of an nftables data type.
type dkind uint8

const (
	kInt     dkind = iota // unsigned big-endian integer (integer, mark, inet_service, ...)
	kAddr4                // ipv4_addr
	kAddr6                // ipv6_addr
	kIfname               // ifname: 16 bytes, NUL padded; "name*" is a prefix wildcard
	kVerdict              // verdict (map data only)
)

// dtype is an nftables data type: its name, width in bytes and symbolic constants.
// Values of every type are fixed-width big-endian byte strings, so that comparison is
// bytes.Compare and a concatenation is the concatenation of its parts.
type dtype struct {
	name    string
	kind    dkind
	width   int
	names   map[string]uint64 // symbolic constants
	bitmask bool              // implicit match means "any of these bits"
	hex     bool              // print as 0x...

	// rev and bits are the constants by value, for printing (filled by init).
	rev  map[uint64]string
	bits []namedBit
}

type namedBit struct {
	name string
	bit  uint64
}

func init() {
	for _, t := range []*dtype{tInetProto, tCTState, tCTStatus, tCTDir, tNFProto, tEtherType, tFibAddrType, tBoolean} {
		t.rev = map[uint64]string{}
		for k, v := range t.names {
			if old, ok := t.rev[v]; !ok || (k < old && k != "icmpv6") || old == "icmpv6" {
				t.rev[v] = k
			}
			if v != 0 {
				t.bits = append(t.bits, namedBit{k, v})
			}
		}
		sort.Slice(t.bits, func(i, j int) bool { return t.bits[i].bit < t.bits[j].bit })
	}
}

var (
	tInteger32   = &dtype{name: "integer", kind: kInt, width: 4}
	tMark        = &dtype{name: "mark", kind: kInt, width: 4, hex: true}
	tIPv4        = &dtype{name: "ipv4_addr", kind: kAddr4, width: 4}
	tIPv6        = &dtype{name: "ipv6_addr", kind: kAddr6, width: 16}
	tIfname      = &dtype{name: "ifname", kind: kIfname, width: 16}
	tIfaceIndex  = &dtype{name: "iface_index", kind: kIfname, width: 16}
	tVerdictType = &dtype{name: "verdict", kind: kVerdict, width: 0}
	tInetProto   = &dtype{name: "inet_proto", kind: kInt, width: 1, names: map[string]uint64{
		"hopopt": 0, "icmp": 1, "igmp": 2, "ipencap": 4, "tcp": 6, "egp": 8, "udp": 17,
		"dccp": 33, "ipv6": 41, "ipv6-route": 43, "ipv6-frag": 44, "rsvp": 46, "gre": 47,
		"esp": 50, "ah": 51, "icmpv6": 58, "ipv6-icmp": 58, "ipv6-nonxt": 59, "ipv6-opts": 60,
		"ospf": 89, "ipip": 94, "pim": 103, "vrrp": 112, "l2tp": 115, "sctp": 132,
		"udplite": 136, "mpls-in-ip": 137,
	}}
	tInetService = &dtype{name: "inet_service", kind: kInt, width: 2, names: map[string]uint64{
		"ftp-data": 20, "ftp": 21, "ssh": 22, "telnet": 23, "smtp": 25, "domain": 53,
		"bootps": 67, "bootpc": 68, "tftp": 69, "http": 80, "kerberos": 88, "pop3": 110,
		"ntp": 123, "imap": 143, "snmp": 161, "bgp": 179, "ldap": 389, "https": 443,
		"submission": 587, "ldaps": 636, "imaps": 993, "pop3s": 995, "mysql": 3306,
		"http-alt": 8080,
	}}
	tCTState = &dtype{name: "ct_state", kind: kInt, width: 4, bitmask: true, names: map[string]uint64{
		"invalid": 1, "established": 2, "related": 4, "new": 8, "untracked": 64,
	}}
	tCTStatus = &dtype{name: "ct_status", kind: kInt, width: 4, bitmask: true, names: map[string]uint64{
		"expected": 1, "seen-reply": 2, "assured": 4, "confirmed": 8, "snat": 16, "dnat": 32, "dying": 512,
	}}
	tCTDir     = &dtype{name: "ct_dir", kind: kInt, width: 1, names: map[string]uint64{"original": 0, "reply": 1}}
	tNFProto   = &dtype{name: "nf_proto", kind: kInt, width: 1, names: map[string]uint64{"ipv4": 2, "ipv6": 10}}
	tEtherType = &dtype{name: "ether_type", kind: kInt, width: 2, names: map[string]uint64{
		"ip": 0x0800, "arp": 0x0806, "ip6": 0x86dd, "vlan": 0x8100,
	}}
	tFibAddrType = &dtype{name: "fib_addrtype", kind: kInt, width: 4, names: map[string]uint64{
		"unspec": 0, "unicast": 1, "local": 2, "broadcast": 3, "anycast": 4, "multicast": 5,
		"blackhole": 6, "unreachable": 7, "prohibit": 8,
	}}
	tBoolean = &dtype{name: "boolean", kind: kInt, width: 1, names: map[string]uint64{"exists": 1, "missing": 0}}
)

// typesByName are the types a set or map "type" declaration may name.
var typesByName = map[string]*dtype{
	"ipv4_addr": tIPv4, "ipv6_addr": tIPv6, "inet_proto": tInetProto, "inet_service": tInetService,
	"mark": tMark, "ifname": tIfname, "iface_index": tIfaceIndex, "verdict": tVerdictType,
	"ct_state": tCTState, "ct_status": tCTStatus, "nf_proto": tNFProto, "ether_type": tEtherType,
	"fib_addrtype": tFibAddrType, "ct_dir": tCTDir,
}

// fieldTypes is the type of an expression: one dtype, or several for a concatenation.
type fieldTypes []*dtype

func (ft fieldTypes) width() int {
	w := 0
	for _, t := range ft {
		w += t.width
	}
	return w
}

func (ft fieldTypes) String() string {
	names := make([]string, len(ft))
	for i, t := range ft {
		names[i] = t.name
	}
	return strings.Join(names, " . ")
}

// compatible reports whether values of ft can be compared with values of other: the
// same number of fields, each of the same width and kind.
func (ft fieldTypes) compatible(other fieldTypes) bool {
	if len(ft) != len(other) {
		return false
	}
	for i := range ft {
		if ft[i].width != other[i].width || ft[i].kind != other[i].kind {
			return false
		}
	}
	return true
}

func putUint(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

func getUint(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// parseConst parses one literal of type t. It returns the range it denotes: lo == hi for
// a single value; a range "a-b", a prefix "addr/len" or an ifname wildcard "eth*" give
// lo < hi.
func parseConst(t *dtype, tok token) (lo, hi []byte, err error) {
	s := tok.text
	if tok.kind != tWord && tok.kind != tString {
		return nil, nil, errAt(tok, "expected a %s value, found %s", t.name, tok.show())
	}
	if strings.HasPrefix(s, "$") {
		return nil, nil, errAt(tok, "variables (%s) are not supported", s)
	}
	if t.kind == kIfname {
		return parseIfname(t, tok)
	}
	if tok.kind == tString {
		return nil, nil, errAt(tok, "expected a %s value, found string %s", t.name, tok.show())
	}
	if t.kind == kVerdict {
		return nil, nil, errAt(tok, "verdicts are not values")
	}
	if v, ok := parseScalar(t, s); ok {
		return v, v, nil
	}
	if i := strings.LastIndexByte(s, '/'); i > 0 && (t.kind == kAddr4 || t.kind == kAddr6) {
		p, perr := netip.ParsePrefix(s)
		if perr != nil || (p.Addr().Is4() != (t.kind == kAddr4)) || p.Addr().Zone() != "" {
			return nil, nil, errAt(tok, "bad %s prefix %q", t.name, s)
		}
		p = p.Masked()
		lo = p.Addr().AsSlice()
		hi = append([]byte(nil), lo...)
		bits := p.Bits()
		for i := bits; i < len(hi)*8; i++ {
			hi[i/8] |= 0x80 >> (i % 8)
		}
		return lo, hi, nil
	}
	if i := strings.IndexByte(s, '-'); i > 0 && i < len(s)-1 {
		a, aok := parseScalar(t, s[:i])
		b, bok := parseScalar(t, s[i+1:])
		if aok && bok {
			if bytes.Compare(a, b) > 0 {
				return nil, nil, errAt(tok, "range %q is empty (start above end)", s)
			}
			return a, b, nil
		}
	}
	return nil, nil, errAt(tok, "bad %s value %q", t.name, s)
}

// parseScalar parses a single value of t.
func parseScalar(t *dtype, s string) ([]byte, bool) {
	switch t.kind {
	case kAddr4, kAddr6:
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4() != (t.kind == kAddr4) {
			return nil, false
		}
		return a.AsSlice(), true
	case kInt:
		if v, ok := t.names[s]; ok {
			b := make([]byte, t.width)
			putUint(b, v)
			return b, true
		}
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			return nil, false
		}
		if t.width < 8 && v>>(8*uint(t.width)) != 0 {
			return nil, false
		}
		b := make([]byte, t.width)
		putUint(b, v)
		return b, true
	}
	return nil, false
}

func parseIfname(t *dtype, tok token) (lo, hi []byte, err error) {
	s := tok.text
	wild := strings.HasSuffix(s, "*") && !strings.HasSuffix(s, `\*`)
	if wild {
		s = s[:len(s)-1]
	}
	if len(s) > 15 || (s == "" && !wild) {
		return nil, nil, errAt(tok, "bad interface name %q", tok.text)
	}
	if t == tIfaceIndex && wild {
		return nil, nil, errAt(tok, "wildcards need iifname/oifname, not iif/oif")
	}
	lo = make([]byte, 16)
	copy(lo, s)
	if !wild {
		return lo, lo, nil
	}
	hi = make([]byte, 16)
	copy(hi, s)
	for i := len(s); i < 16; i++ {
		hi[i] = 0xff
	}
	return lo, hi, nil
}

// formatValue renders one value of type t the way nft lists it.
func formatValue(t *dtype, b []byte) string {
	switch t.kind {
	case kAddr4, kAddr6:
		if a, ok := netip.AddrFromSlice(b); ok {
			return a.String()
		}
	case kIfname:
		n := bytes.IndexByte(b, 0)
		if n < 0 {
			n = len(b)
		}
		return strconv.Quote(string(b[:n]))
	case kInt:
		v := getUint(b)
		if t.bitmask && len(t.bits) > 0 {
			if v == 0 {
				return "0"
			}
			var parts []string
			rest := v
			for _, nb := range t.bits {
				if v&nb.bit == nb.bit {
					parts = append(parts, nb.name)
					rest &^= nb.bit
				}
			}
			if rest != 0 {
				parts = append(parts, fmt.Sprintf("%#x", rest))
			}
			return strings.Join(parts, ",")
		}
		if name, ok := t.rev[v]; ok {
			return name
		}
		if t.hex {
			return fmt.Sprintf("0x%08x", v)
		}
		return strconv.FormatUint(v, 10)
	}
	return fmt.Sprintf("%x", b)
}

// formatFields renders a concatenated value field by field.
func formatFields(ft fieldTypes, b []byte) string {
	if len(ft) == 1 {
		return formatValue(ft[0], b)
	}
	var parts []string
	off := 0
	for _, t := range ft {
		if off+t.width > len(b) {
			break
		}
		parts = append(parts, formatValue(t, b[off:off+t.width]))
		off += t.width
	}
	return strings.Join(parts, " . ")
}

// formatRange renders lo-hi of type t, as a prefix when it is one.
func formatRange(t *dtype, lo, hi []byte) string {
	if bytes.Equal(lo, hi) {
		return formatValue(t, lo)
	}
	if t.kind == kAddr4 || t.kind == kAddr6 {
		if bits, ok := prefixLen(lo, hi); ok {
			return formatValue(t, lo) + "/" + strconv.Itoa(bits)
		}
	}
	if t.kind == kIfname {
		n := bytes.IndexByte(lo, 0)
		if n < 0 {
			n = len(lo)
		}
		return strconv.Quote(string(lo[:n]) + "*")
	}
	return formatValue(t, lo) + "-" + formatValue(t, hi)
}

func prefixLen(lo, hi []byte) (int, bool) {
	bits := 0
	i := 0
	for ; i < len(lo)*8; i++ {
		l := lo[i/8] & (0x80 >> (i % 8))
		h := hi[i/8] & (0x80 >> (i % 8))
		if l != h {
			break
		}
		bits++
	}
	for ; i < len(lo)*8; i++ {
		if lo[i/8]&(0x80>>(i%8)) != 0 || hi[i/8]&(0x80>>(i%8)) == 0 {
			return 0, false
		}
	}
	return bits, true
}

// incr returns b+1 as a new slice, and false if b is all ones.
func incr(b []byte) ([]byte, bool) {
	r := append([]byte(nil), b...)
	for i := len(r) - 1; i >= 0; i-- {
		r[i]++
		if r[i] != 0 {
			return r, true
		}
	}
	return nil, false
}

// be32 encodes v as 4 big-endian bytes.
func be32(v uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return b[:]
}
