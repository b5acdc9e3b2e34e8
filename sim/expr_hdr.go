package sim

import (
	"net/netip"
	"sort"
	"strings"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/packet"
)

// symbols are the symbolic constants of an expression whose data type the shared
// codec does not have (icmp_type, tcp_flag, pkt_type, dscp, ...): the simulator types
// the expression as an integer of the kernel's width and reads these names itself.
type symbols map[string]uint64

// symbolic is an expression with symbolic constants; bitmask says its implicit match
// means "any of these bits" (tcp flags).
type symbolic interface {
	symbols() (syms symbols, bitmask bool)
}

// symbolsOf returns the symbolic constants of each field of e (nil entries for
// fields without), or nil when e has none.
func symbolsOf(e expr) []symbols {
	switch e := e.(type) {
	case symbolic:
		s, _ := e.symbols()
		return []symbols{s}
	case *binopExpr:
		return symbolsOf(e.x)
	case *concatExpr:
		var out []symbols
		found := false
		for _, p := range e.parts {
			ps := symbolsOf(p)
			if ps == nil {
				ps = make([]symbols, len(p.typ()))
			} else {
				found = true
			}
			out = append(out, ps...)
		}
		if found {
			return out
		}
	}
	return nil
}

func isBitmaskExpr(e expr) bool {
	if b, ok := e.(*binopExpr); ok {
		e = b.x
	}
	if s, ok := e.(symbolic); ok {
		_, bm := s.symbols()
		return bm
	}
	return false
}

// parseSymConst parses a literal of type t that may be one of syms: a name, a
// number, or a range of numbers "a-b". Without syms it is parseConst.
func parseSymConst(t *nftdata.Type, syms symbols, tok token) (lo, hi []byte, err error) {
	if syms == nil {
		return parseConst(t, tok)
	}
	if tok.kind == tWord {
		if v, ok := syms[tok.text]; ok {
			b := make([]byte, t.Width())
			nftdata.PutUint(b, v)
			return b, b, nil
		}
		if i := strings.IndexByte(tok.text[1:], '-'); i >= 0 {
			a, aok := syms[tok.text[:i+1]]
			z, zok := syms[tok.text[i+2:]]
			if aok && zok && a <= z {
				lo, hi = make([]byte, t.Width()), make([]byte, t.Width())
				nftdata.PutUint(lo, a)
				nftdata.PutUint(hi, z)
				return lo, hi, nil
			}
		}
		if tok.text != "" && tok.text[0] >= '0' && tok.text[0] <= '9' {
			return parseConst(t, tok)
		}
	}
	return nil, nil, errAt(tok, "unknown value %s (expected a number or one of %s)", tok.show(), symNames(syms))
}

func symNames(syms symbols) string {
	names := make([]string, 0, len(syms))
	for n := range syms {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 8 {
		names = append(names[:8], "...")
	}
	return strings.Join(names, ", ")
}

var (
	icmpTypes   = toSymbols(packet.ICMPTypeNames(packet.ICMP))
	icmpv6Types = toSymbols(packet.ICMPTypeNames(packet.ICMPv6))
	icmpCodes   = toSymbols(packet.ICMPCodeNames(packet.ICMP))
	icmpv6Codes = toSymbols(packet.ICMPCodeNames(packet.ICMPv6))
	tcpFlags    = toSymbols(packet.TCPFlagNames())
	pktTypes    = symbols{"host": 0, "unicast": 0, "broadcast": 1, "multicast": 2, "other": 3}
	ifTypes     = symbols{
		"ether": 1, "ppp": 512, "ipip": 768, "ipip6": 769, "loopback": 772, "sit": 776,
		"ipgre": 778,
	}
	dscpNames = symbols{
		"cs0": 0, "cs1": 8, "cs2": 16, "cs3": 24, "cs4": 32, "cs5": 40, "cs6": 48, "cs7": 56,
		"af11": 10, "af12": 12, "af13": 14, "af21": 18, "af22": 20, "af23": 22, "af31": 26,
		"af32": 28, "af33": 30, "af41": 34, "af42": 36, "af43": 38, "ef": 46, "le": 1,
	}
	idNames = symbols{"root": 0}
)

func toSymbols(m map[string]uint8) symbols {
	out := symbols{}
	for k, v := range m {
		out[k] = uint64(v)
	}
	return out
}

// Integer types of widths the shared codec has no plain integer for: their values
// are only ever written as numbers or through symbols, so the constant names of the
// codec's type of that width are never read.
var integer16 = nftdata.InetService

// icmpField is icmp or icmpv6 type and code: the packet's message (Packet.ICMP), by
// default an echo request (or, in the reply direction of a connection, an echo
// reply) with code 0.
type icmpField struct {
	proto packet.Protocol // ICMP or ICMPv6
	field string          // type, code
}

func (e *icmpField) typ() fieldTypes { return fieldTypes{nftdata.Integer8} }
func (e *icmpField) String() string  { return e.proto.String() + " " + e.field }

func (e *icmpField) symbols() (symbols, bool) {
	switch {
	case e.field == "code" && e.proto == packet.ICMP:
		return icmpCodes, false
	case e.field == "code":
		return icmpv6Codes, false
	case e.proto == packet.ICMP:
		return icmpTypes, false
	}
	return icmpv6Types, false
}

func (e *icmpField) eval(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	if st.proto != e.proto {
		return b, false
	}
	if st.icmp.Set {
		if e.field == "code" {
			return append(b, st.icmp.Code), true
		}
		return append(b, st.icmp.Type), true
	}
	if e.field == "code" {
		return append(b, 0), true
	}
	switch {
	case e.proto == packet.ICMP && st.reply:
		return append(b, 0), true
	case e.proto == packet.ICMP:
		return append(b, 8), true
	case st.reply:
		return append(b, 129), true
	}
	return append(b, 128), true
}

// tcpFlagsExpr is "tcp flags": the packet's (Packet.Flags), by default SYN for a
// packet that opens a connection (ct new, or untracked) and ACK for any other.
type tcpFlagsExpr struct{}

func (e *tcpFlagsExpr) typ() fieldTypes          { return fieldTypes{nftdata.Integer8} }
func (e *tcpFlagsExpr) String() string           { return "tcp flags" }
func (e *tcpFlagsExpr) symbols() (symbols, bool) { return tcpFlags, true }

func (e *tcpFlagsExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	if st.proto != packet.TCP {
		return b, false
	}
	if st.flags != 0 {
		return append(b, st.flags), true
	}
	if st.conn == nil && (st.declared == packet.CTNew || st.declared == packet.CTUntracked) {
		return append(b, byte(tcpFlags["syn"])), true
	}
	return append(b, byte(tcpFlags["ack"])), true
}

// ipHdrField is a field of the IPv4 or IPv6 header other than the addresses and
// protocol: ip ttl, dscp, length, version, frag-off; ip6 hoplimit, dscp, length,
// version. A
// packet leaves its sender with TTL 64, DSCP cs0 and no payload beyond its
// transport header (ping's 56 bytes for icmp echo); forwarding decrements the TTL.
type ipHdrField struct {
	fam   packet.Family
	field string
}

func (e *ipHdrField) typ() fieldTypes {
	if e.field == "length" || e.field == "frag-off" {
		return fieldTypes{integer16}
	}
	return fieldTypes{nftdata.Integer8}
}

func (e *ipHdrField) String() string { return e.fam.String() + " " + e.field }

func (e *ipHdrField) symbols() (symbols, bool) {
	if e.field == "dscp" {
		return dscpNames, false
	}
	return nil, false
}

func (e *ipHdrField) eval(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	if st.fam != e.fam {
		return b, false
	}
	switch e.field {
	case "ttl", "hoplimit":
		return append(b, st.ttl), true
	case "dscp":
		return append(b, st.dscp), true
	case "frag-off":
		// Unfragmented, with Don't Fragment set, as Linux sends with path MTU
		// discovery.
		return append(b, 0x40, 0), true
	case "version":
		return append(b, byte(st.fam)), true
	}
	n := st.length()
	if st.fam == packet.IPv6 {
		n -= 40 // ip6 length is the payload length
	}
	return append(b, byte(n>>8), byte(n)), true
}

// length is the packet's length from its network header: the IP header, the
// transport header (a SYN with the options Linux sends, later TCP segments with
// timestamps) and, for icmp echo, ping's 56 bytes of data; other ICMP messages are
// their 8-byte header and fixed fields (timestamps, address mask, neighbor
// discovery's addresses and timers), without options or payload.
func (st *pktState) length() int {
	n := 20
	if st.fam == packet.IPv6 {
		n = 40
	}
	switch st.proto {
	case packet.TCP:
		syn := st.conn == nil && st.declared == packet.CTNew
		if st.flags != 0 {
			syn = st.flags&packet.FlagSYN != 0
		}
		if syn {
			return n + 40
		}
		return n + 32
	case packet.UDP:
		return n + 8
	case packet.SCTP:
		return n + 32
	}
	if st.icmp.Set {
		switch t := st.icmp.Type; {
		case st.proto == packet.ICMP && (t == 13 || t == 14):
			return n + 20 // three timestamps
		case st.proto == packet.ICMP && (t == 17 || t == 18):
			return n + 12 // an address mask
		case st.proto == packet.ICMPv6 && t == 134:
			return n + 16 // router advertisement: hop limit, flags, lifetime, timers
		case st.proto == packet.ICMPv6 && (t == 135 || t == 136):
			return n + 24 // neighbor solicitation or advertisement: the target address
		case st.proto == packet.ICMPv6 && t == 137:
			return n + 40 // redirect: target and destination addresses
		case st.proto == packet.ICMP && t != 0 && t != 8, st.proto == packet.ICMPv6 && t != 128 && t != 129:
			return n + 8
		}
	}
	return n + 64
}

// pktType is meta pkttype as the kernel derives it: from the destination address.
func pktType(a netip.Addr) byte {
	switch {
	case a.IsMulticast():
		return 2
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return 1
	}
	return 0
}

// ifType is the ARPHRD type of an interface: loopback for lo, Ethernet otherwise.
func ifType(name string) uint16 {
	if name == "lo" {
		return 772
	}
	return 1
}

func (e *metaExpr) symbols() (symbols, bool) {
	switch e.key {
	case "pkttype":
		return pktTypes, false
	case "iiftype", "oiftype":
		return ifTypes, false
	case "skuid", "skgid":
		return idNames, false
	}
	return nil, false
}

// undecided says why the packet cannot decide a match on e, or "" when it can: the
// owner of the socket a node's own packet was sent from.
func (e *metaExpr) undecided(c *evalCtx) string {
	if (e.key == "skuid" || e.key == "skgid") && c.st.local {
		return "the sending socket's owner"
	}
	return ""
}

// evalExtra loads the meta keys beyond the basic ones.
func (e *metaExpr) evalExtra(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	switch e.key {
	case "pkttype":
		return append(b, pktType(st.dst.Addr())), true
	case "iiftype", "oiftype":
		name := st.iif
		if e.key == "oiftype" {
			name = st.oif
		}
		if name == "" {
			return b, false
		}
		t := ifType(name)
		return append(b, byte(t>>8), byte(t)), true
	case "length":
		return append(b, be32(uint32(st.length()))...), true
	case "skuid", "skgid":
		// Only the node's own packets have a socket; its owner is a fork (undecided).
		if !st.local {
			c.note("no socket: the packet was not sent by the node")
			return b, false
		}
		return append(b, 0, 0, 0, 0), true
	}
	return b, false
}

// hdrSetStmt is "ip dscp set V", "ip ttl set V", "ip6 hoplimit set V".
type hdrSetStmt struct {
	f   *ipHdrField
	val uint8
	txt string
}

func (s *hdrSetStmt) String() string { return s.txt }

func (s *hdrSetStmt) exec(c *evalCtx) (result, *verdict) {
	if c.st.fam != s.f.fam {
		return rBreak, nil
	}
	if s.f.field == "dscp" {
		c.st.dscp = s.val
	} else {
		c.st.ttl = s.val
	}
	return rNext, nil
}
