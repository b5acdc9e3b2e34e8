package nftdata

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Kind is the base kind of a data type: how its values are written and read.
type Kind uint8

// The kinds of data types.
const (
	// KindInteger is an unsigned integer (integer, mark, inet_proto, inet_service, ...).
	KindInteger Kind = iota
	// KindIPv4 is ipv4_addr.
	KindIPv4
	// KindIPv6 is ipv6_addr.
	KindIPv6
	// KindIfname is an interface name: 16 bytes, NUL padded; "name*" is a prefix
	// wildcard.
	KindIfname
	// KindVerdict is verdict, which only map data has.
	KindVerdict
)

// Type is an nftables data type: its name, the width of its values and its symbolic
// constants. The values Parse returns and Format reads are fixed-width big-endian
// byte strings, so that they compare with bytes.Compare; Layout turns them into the
// bytes the kernel stores, which differ for host-order types (mark).
type Type struct {
	name  string
	kind  Kind
	width int
	// hostOrder is set for types the kernel stores in host byte order.
	hostOrder bool
	// bitmask is set for types whose implicit match means "any of these bits".
	bitmask bool
	// hex prints values as 0x%08x.
	hex bool
	// unstored is set for types whose values here are not the kernel's: iface_index,
	// kept by name where the kernel keeps an index, and verdict.
	unstored bool
	// consts are the symbolic constants; printNames says whether Format uses them.
	consts     []constant
	printNames bool

	// byName, byValue and bits index consts (filled by init).
	byName  map[string]uint64
	byValue map[uint64]string
	bits    []constant
}

// constant is a symbolic value of a type.
type constant struct {
	name  string
	value uint64
}

// The data types nftables rulesets of the project's kind use.
var (
	Integer8    = &Type{name: "integer", kind: KindInteger, width: 1}
	Integer32   = &Type{name: "integer", kind: KindInteger, width: 4}
	Mark        = &Type{name: "mark", kind: KindInteger, width: 4, hex: true, hostOrder: true}
	IPv4Addr    = &Type{name: "ipv4_addr", kind: KindIPv4, width: 4}
	IPv6Addr    = &Type{name: "ipv6_addr", kind: KindIPv6, width: 16}
	Ifname      = &Type{name: "ifname", kind: KindIfname, width: 16}
	IfaceIndex  = &Type{name: "iface_index", kind: KindIfname, width: 16, unstored: true}
	VerdictType = &Type{name: "verdict", kind: KindVerdict, unstored: true}
	InetProto   = &Type{name: "inet_proto", kind: KindInteger, width: 1, consts: protocols, printNames: true}
	InetService = &Type{name: "inet_service", kind: KindInteger, width: 2, consts: []constant{
		{"ftp-data", 20}, {"ftp", 21}, {"ssh", 22}, {"telnet", 23}, {"smtp", 25}, {"domain", 53},
		{"bootps", 67}, {"bootpc", 68}, {"tftp", 69}, {"http", 80}, {"kerberos", 88}, {"pop3", 110},
		{"ntp", 123}, {"imap", 143}, {"snmp", 161}, {"bgp", 179}, {"ldap", 389}, {"https", 443},
		{"submission", 587}, {"ldaps", 636}, {"imaps", 993}, {"pop3s", 995}, {"mysql", 3306},
		{"http-alt", 8080},
	}}
	CTState = &Type{name: "ct_state", kind: KindInteger, width: 4, hostOrder: true, bitmask: true, printNames: true, consts: []constant{
		{"invalid", 1}, {"established", 2}, {"related", 4}, {"new", 8}, {"untracked", 64},
	}}
	CTStatus = &Type{name: "ct_status", kind: KindInteger, width: 4, hostOrder: true, bitmask: true, printNames: true, consts: []constant{
		{"expected", 1}, {"seen-reply", 2}, {"assured", 4}, {"confirmed", 8}, {"snat", 16}, {"dnat", 32}, {"dying", 512},
	}}
	CTDir     = &Type{name: "ct_dir", kind: KindInteger, width: 1, printNames: true, consts: []constant{{"original", 0}, {"reply", 1}}}
	NFProto   = &Type{name: "nf_proto", kind: KindInteger, width: 1, printNames: true, consts: []constant{{"ipv4", 2}, {"ipv6", 10}}}
	EtherType = &Type{name: "ether_type", kind: KindInteger, width: 2, printNames: true, consts: []constant{
		{"ip", 0x0800}, {"arp", 0x0806}, {"ip6", 0x86dd}, {"vlan", 0x8100},
	}}
	FibAddrType = &Type{name: "fib_addrtype", kind: KindInteger, width: 4, hostOrder: true, printNames: true, consts: []constant{
		{"unspec", 0}, {"unicast", 1}, {"local", 2}, {"broadcast", 3}, {"anycast", 4}, {"multicast", 5},
		{"blackhole", 6}, {"unreachable", 7}, {"prohibit", 8},
	}}
	Boolean = &Type{name: "boolean", kind: KindInteger, width: 1, printNames: true, consts: []constant{{"exists", 1}, {"missing", 0}}}
)

// declared are the types a set or map "type" declaration may name.
var declared = map[string]*Type{}

func init() {
	for _, t := range []*Type{Mark, IPv4Addr, IPv6Addr, Ifname, IfaceIndex, VerdictType, InetProto,
		InetService, CTState, CTStatus, CTDir, NFProto, EtherType, FibAddrType, Boolean} {
		declared[t.name] = t
	}
	for _, t := range declared {
		t.byName, t.byValue = map[string]uint64{}, map[uint64]string{}
		for _, c := range t.consts {
			t.byName[c.name] = c.value
			if _, ok := t.byValue[c.value]; !ok && t.printNames {
				t.byValue[c.value] = c.name
			}
			if c.value != 0 && t.bitmask {
				t.bits = append(t.bits, c)
			}
		}
		slices.SortFunc(t.bits, func(a, b constant) int { return int(a.value) - int(b.value) })
	}
}

// TypeByName returns the data type a set or map declaration names ("ipv4_addr",
// "inet_service", "verdict", ...), and false for one this package does not know.
func TypeByName(name string) (*Type, bool) {
	t, ok := declared[name]
	return t, ok
}

// Name returns the type's nft name.
func (t *Type) Name() string { return t.name }

// Kind returns the base kind of the type.
func (t *Type) Kind() Kind { return t.kind }

// Width returns the number of bytes of a value of the type (0 for verdict).
func (t *Type) Width() int { return t.width }

// Bitmask reports whether values of the type are sets of bits (ct_state), which
// an implicit match tests for any of.
func (t *Type) Bitmask() bool { return t.bitmask }

// String returns the type's nft name.
func (t *Type) String() string { return t.name }

// Parse parses one value of the type as nft reads it: an address, a number (decimal
// or 0x hex) or a symbolic constant ("tcp", "http", "established").
func (t *Type) Parse(s string) ([]byte, error) {
	switch t.kind {
	case KindIPv4, KindIPv6:
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4() != (t.kind == KindIPv4) {
			return nil, fmt.Errorf("bad %s value %q", t.name, s)
		}
		return a.AsSlice(), nil
	case KindInteger:
		v, ok := t.byName[s]
		if !ok {
			var err error
			if v, err = strconv.ParseUint(s, 0, 64); err != nil || (t.width < 8 && v>>(8*uint(t.width)) != 0) {
				return nil, fmt.Errorf("bad %s value %q", t.name, s)
			}
		}
		b := make([]byte, t.width)
		PutUint(b, v)
		return b, nil
	case KindIfname:
		lo, hi, err := t.ParseRange(s)
		if err == nil && !bytes.Equal(lo, hi) {
			err = fmt.Errorf("bad %s value %q: a wildcard is not one value", t.name, s)
		}
		return lo, err
	}
	return nil, fmt.Errorf("%s values are not data", t.name)
}

// ParseRange parses a value or a range of values of the type and returns the first
// and last value: lo == hi for a single value, lo < hi for a range "a-b", a prefix
// "addr/len" or an interface-name wildcard "eth*".
func (t *Type) ParseRange(s string) (lo, hi []byte, err error) {
	if t.kind == KindIfname {
		return t.parseIfname(s)
	}
	if v, err := t.Parse(s); err == nil {
		return v, v, nil
	}
	if i := strings.LastIndexByte(s, '/'); i > 0 && (t.kind == KindIPv4 || t.kind == KindIPv6) {
		p, perr := netip.ParsePrefix(s)
		if perr != nil || p.Addr().Is4() != (t.kind == KindIPv4) || p.Addr().Zone() != "" {
			return nil, nil, fmt.Errorf("bad %s prefix %q", t.name, s)
		}
		p = p.Masked()
		lo = p.Addr().AsSlice()
		hi = slices.Clone(lo)
		for i := p.Bits(); i < len(hi)*8; i++ {
			hi[i/8] |= 0x80 >> (i % 8)
		}
		return lo, hi, nil
	}
	if i := strings.IndexByte(s, '-'); i > 0 && i < len(s)-1 {
		a, aerr := t.Parse(s[:i])
		b, berr := t.Parse(s[i+1:])
		if aerr == nil && berr == nil {
			if bytes.Compare(a, b) > 0 {
				return nil, nil, fmt.Errorf("range %q is empty (start above end)", s)
			}
			return a, b, nil
		}
	}
	return nil, nil, fmt.Errorf("bad %s value %q", t.name, s)
}

// parseIfname parses an interface name, or a wildcard "name*" matching the names
// that start with name.
func (t *Type) parseIfname(s string) (lo, hi []byte, err error) {
	name := s
	wild := strings.HasSuffix(s, "*") && !strings.HasSuffix(s, `\*`)
	if wild {
		name = s[:len(s)-1]
	}
	if len(name) > 15 || (name == "" && !wild) {
		return nil, nil, fmt.Errorf("bad interface name %q", s)
	}
	if t == IfaceIndex && wild {
		return nil, nil, fmt.Errorf("bad interface %q: wildcards need an ifname (iifname, oifname), not iif or oif", s)
	}
	lo = make([]byte, 16)
	copy(lo, name)
	if !wild {
		return lo, lo, nil
	}
	hi = make([]byte, 16)
	copy(hi, name)
	for i := len(name); i < 16; i++ {
		hi[i] = 0xff
	}
	return lo, hi, nil
}

// Format renders one value of the type the way nft lists it.
func (t *Type) Format(b []byte) string {
	switch t.kind {
	case KindIPv4, KindIPv6:
		if a, ok := netip.AddrFromSlice(b); ok {
			return a.String()
		}
	case KindIfname:
		n := bytes.IndexByte(b, 0)
		if n < 0 {
			n = len(b)
		}
		return strconv.Quote(string(b[:n]))
	case KindInteger:
		v := Uint(b)
		if len(t.bits) > 0 {
			return t.formatBits(v)
		}
		if name, ok := t.byValue[v]; ok {
			return name
		}
		if t.hex {
			return fmt.Sprintf("0x%08x", v)
		}
		return strconv.FormatUint(v, 10)
	}
	return fmt.Sprintf("%x", b)
}

// formatBits renders a bitmask value as the names of its bits, joined by commas.
func (t *Type) formatBits(v uint64) string {
	if v == 0 {
		return "0"
	}
	var parts []string
	rest := v
	for _, c := range t.bits {
		if v&c.value == c.value {
			parts = append(parts, c.name)
			rest &^= c.value
		}
	}
	if rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", rest))
	}
	return strings.Join(parts, ",")
}

// FormatRange renders the values lo to hi of the type: one value when they are
// equal, a prefix when the range is one, a wildcard for interface names, "lo-hi"
// otherwise.
func (t *Type) FormatRange(lo, hi []byte) string {
	if bytes.Equal(lo, hi) {
		return t.Format(lo)
	}
	if t.kind == KindIPv4 || t.kind == KindIPv6 {
		if bits, ok := prefixLen(lo, hi); ok {
			return t.Format(lo) + "/" + strconv.Itoa(bits)
		}
	}
	if t.kind == KindIfname {
		n := bytes.IndexByte(lo, 0)
		if n < 0 {
			n = len(lo)
		}
		return strconv.Quote(string(lo[:n]) + "*")
	}
	return t.Format(lo) + "-" + t.Format(hi)
}

// prefixLen returns the length of the prefix whose first and last values are lo and
// hi, and false when lo-hi is not a prefix.
func prefixLen(lo, hi []byte) (int, bool) {
	bit := func(b []byte, i int) byte { return b[i/8] & (0x80 >> (i % 8)) }
	i := 0
	for i < len(lo)*8 && bit(lo, i) == bit(hi, i) {
		i++
	}
	bits := i
	for ; i < len(lo)*8; i++ {
		if bit(lo, i) != 0 || bit(hi, i) == 0 {
			return 0, false
		}
	}
	return bits, true
}

// PutUint writes v big-endian into all of b.
func PutUint(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

// Uint reads b as a big-endian unsigned integer.
func Uint(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}
