package sim

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/packet"
)

// expr is a compiled nftables expression: it loads a value (fixed-width bytes) from the
// packet, its metadata, conntrack or the runtime.
type expr interface {
	// eval appends the expression's value to b. ok is false when the value cannot be
	// fetched (ip saddr of an IPv6 packet, th dport of icmp, a map lookup that misses):
	// the kernel then stops evaluating the rule (NFT_BREAK).
	eval(c *evalCtx, b []byte) (out []byte, ok bool)
	typ() fieldTypes
	String() string
}

// ipField is ip/ip6 saddr, daddr and protocol/nexthdr.
type ipField struct {
	fam   packet.Family
	field string // saddr, daddr, protocol (ip), nexthdr (ip6)
}

func (e *ipField) typ() fieldTypes {
	switch e.field {
	case "protocol", "nexthdr":
		return fieldTypes{nftdata.InetProto}
	}
	if e.fam == packet.IPv4 {
		return fieldTypes{nftdata.IPv4Addr}
	}
	return fieldTypes{nftdata.IPv6Addr}
}

func (e *ipField) String() string {
	if e.fam == packet.IPv4 {
		return "ip " + e.field
	}
	return "ip6 " + e.field
}

func (e *ipField) eval(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	if st.fam != e.fam {
		return b, false
	}
	switch e.field {
	case "saddr":
		return appendAddr(b, st.src.Addr()), true
	case "daddr":
		return appendAddr(b, st.dst.Addr()), true
	}
	return append(b, byte(st.proto)), true
}

func appendAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return append(b, v[:]...)
	}
	v := a.As16()
	return append(b, v[:]...)
}

// thField is a transport header port: tcp/udp/sctp sport/dport, or th (any of them).
type thField struct {
	proto packet.Protocol // 0 for th
	field string          // sport, dport
}

func (e *thField) typ() fieldTypes { return fieldTypes{nftdata.InetService} }

func (e *thField) String() string {
	if e.proto == 0 {
		return "th " + e.field
	}
	return e.proto.String() + " " + e.field
}

func (e *thField) eval(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	if e.proto != 0 && st.proto != e.proto {
		return b, false
	}
	if !st.proto.HasPorts() {
		// The simulator has no header bytes for protocols without ports.
		return b, false
	}
	p := st.dst.Port()
	if e.field == "sport" {
		p = st.src.Port()
	}
	return append(b, byte(p>>8), byte(p)), true
}

// metaExpr is a meta key.
type metaExpr struct{ key string }

var metaTypes = map[string]*nftdata.Type{
	"l4proto": nftdata.InetProto, "nfproto": nftdata.NFProto, "protocol": nftdata.EtherType, "mark": nftdata.Mark,
	"iif": nftdata.IfaceIndex, "iifname": nftdata.Ifname, "oif": nftdata.IfaceIndex, "oifname": nftdata.Ifname,
	"nftrace": nftdata.Integer8,
	"pkttype": nftdata.Integer8, "iiftype": integer16, "oiftype": integer16, "length": nftdata.Integer32,
	"skuid": nftdata.Integer32, "skgid": nftdata.Integer32,
}

func (e *metaExpr) typ() fieldTypes { return fieldTypes{metaTypes[e.key]} }
func (e *metaExpr) String() string  { return "meta " + e.key }

func (e *metaExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	switch e.key {
	case "l4proto":
		return append(b, byte(st.proto)), true
	case "nfproto":
		if st.fam == packet.IPv4 {
			return append(b, 2), true
		}
		return append(b, 10), true
	case "protocol":
		if st.fam == packet.IPv4 {
			return append(b, 0x08, 0x00), true
		}
		return append(b, 0x86, 0xdd), true
	case "mark":
		return append(b, be32(st.mark)...), true
	case "iif", "iifname":
		// Without an interface the kernel loads an empty name (index 0), which
		// matches no interface.
		return appendIfname(b, st.iif), true
	case "oif", "oifname":
		return appendIfname(b, st.oif), true
	case "nftrace":
		if st.nftrace {
			return append(b, 1), true
		}
		return append(b, 0), true
	}
	return e.evalExtra(c, b)
}

func appendIfname(b []byte, name string) []byte {
	var n [16]byte
	copy(n[:], name)
	return append(b, n[:]...)
}

// ctExpr is a conntrack key: ct state/status/mark/direction, or a tuple field of the
// original or reply direction.
type ctExpr struct {
	key  string        // state, status, mark, direction, l3proto, protocol, saddr, daddr, proto-src, proto-dst
	dir  string        // "", original, reply
	fam  packet.Family // for saddr/daddr
	vtyp *nftdata.Type // value type
}

func (e *ctExpr) typ() fieldTypes { return fieldTypes{e.vtyp} }

func (e *ctExpr) String() string {
	s := "ct "
	if e.dir != "" {
		s += e.dir + " "
	}
	switch e.key {
	case "saddr", "daddr":
		if e.fam == packet.IPv6 {
			return s + "ip6 " + e.key
		}
		return s + "ip " + e.key
	}
	return s + e.key
}

func (e *ctExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	switch e.key {
	case "state":
		return append(b, be32(st.ctStateBits())...), true
	}
	if !st.hasConn() {
		// Without a conntrack entry every other ct key fails to load.
		return b, false
	}
	switch e.key {
	case "status":
		return append(b, be32(st.ctStatus)...), true
	case "mark":
		return append(b, be32(st.ctMark)...), true
	case "direction":
		if st.reply {
			return append(b, 1), true
		}
		return append(b, 0), true
	case "l3proto":
		if st.fam == packet.IPv4 {
			return append(b, 2), true
		}
		return append(b, 10), true
	case "protocol":
		return append(b, byte(st.proto)), true
	case "zone":
		return append(b, be32(uint32(st.zoneID(e.dir)))...), true
	}
	orig, reply := st.tuples()
	t := orig
	if e.dir == "reply" {
		t = reply
	}
	switch e.key {
	case "saddr", "daddr":
		if st.fam != e.fam {
			return b, false
		}
		if e.key == "saddr" {
			return appendAddr(b, t.Src.Addr()), true
		}
		return appendAddr(b, t.Dst.Addr()), true
	case "proto-src":
		return append(b, byte(t.Src.Port()>>8), byte(t.Src.Port())), true
	case "proto-dst":
		return append(b, byte(t.Dst.Port()>>8), byte(t.Dst.Port())), true
	}
	return b, false
}

// numgenExpr is "numgen random|inc mod N [offset K]". Random numgen forks the trace.
type numgenExpr struct {
	random bool
	mod    uint32
	offset uint32
	site   string // identifies this expression for inc counters, stable across reloads
}

func (e *numgenExpr) typ() fieldTypes { return fieldTypes{nftdata.Integer32} }

func (e *numgenExpr) String() string {
	s := "numgen inc mod " + strconv.FormatUint(uint64(e.mod), 10)
	if e.random {
		s = "numgen random mod " + strconv.FormatUint(uint64(e.mod), 10)
	}
	if e.offset != 0 {
		s += " offset " + strconv.FormatUint(uint64(e.offset), 10)
	}
	return s
}

func (e *numgenExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	var v uint32
	if e.random {
		v = uint32(c.choose(int(e.mod), e))
	} else {
		v = c.numgenInc(e)
	}
	return append(b, be32(v+e.offset)...), true
}

// fibExpr is "fib saddr|daddr [. iif|. oif|. mark] type|oif|oifname": the address
// type of the packet's source or destination, judged against the node's addresses,
// or the interface the route to it leaves by. With saddr the lookup is the reverse
// path check: the route back to the source, which with ". iif" must leave by the
// interface the packet came in on.
type fibExpr struct {
	addr   string // saddr, daddr
	extra  string // "", ". iif", ". oif", ". mark" (mark: no effect, the node has one table)
	result string // type, oif, oifname
}

func (e *fibExpr) typ() fieldTypes {
	switch e.result {
	case "oif":
		return fieldTypes{nftdata.IfaceIndex}
	case "oifname":
		return fieldTypes{nftdata.Ifname}
	}
	return fieldTypes{nftdata.FibAddrType}
}

func (e *fibExpr) String() string { return "fib " + e.addr + e.extra + " " + e.result }

func (e *fibExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	a := c.st.dst.Addr()
	if e.addr == "saddr" {
		a = c.st.src.Addr()
	}
	if e.result == "type" {
		return append(b, be32(c.fibType(e, a))...), true
	}
	return appendIfname(b, c.fibOIf(e, a)), true
}

// fibType is the address type of a. Bound to an interface (". iif", ". oif"), a
// node address counts as local only on the interface that holds it, as
// inet_dev_addr_type answers: on any other it is unicast. The interface holding an
// address is lo for loopback addresses, else the one of its route (Env.Routes).
func (c *evalCtx) fibType(e *fibExpr, a netip.Addr) uint32 {
	t := c.rt.addrType(a)
	dev := ""
	switch {
	case t != 2:
		return t
	case strings.Contains(e.extra, "iif"):
		dev = c.st.iif
	case strings.Contains(e.extra, "oif"):
		dev = c.st.oif
	}
	if dev == "" {
		return t
	}
	holder := "lo"
	if !a.IsLoopback() {
		r, ok := c.rt.env.route(a)
		if !ok {
			c.note("fib: the interface holding " + a.String() + " is unknown (no route in Env.Routes), taken to be " + dev)
			return t
		}
		holder = r.Dev
	}
	if holder != dev {
		c.note("fib: " + a.String() + " is on " + holder + ", not " + dev + ": unicast")
		return 1
	}
	return t
}

// fibOIf is the interface a fib lookup of a finds, "" for none (fib ... oif
// missing), as nft_fib4/6 answer: a packet that came in on lo, in prerouting or
// input, gets lo itself; a lookup that ends at a node address (a local route)
// finds nothing; otherwise the route's interface, which with ". iif" (". oif")
// must be the packet's input (output) interface.
func (c *evalCtx) fibOIf(e *fibExpr, a netip.Addr) string {
	st := c.st
	if st.iif == "lo" && (c.hook == HookPrerouting || c.hook == HookInput) {
		return "lo"
	}
	if c.rt.local.has(a) {
		c.note("fib: " + a.String() + " is a node address (a local route): no interface")
		return ""
	}
	want := ""
	switch {
	case strings.Contains(e.extra, "iif"):
		want = st.iif
	case strings.Contains(e.extra, "oif"):
		want = st.oif
	}
	if len(c.rt.env.Routes) == 0 {
		// Without routes every address is taken to be reachable, through the
		// interface the lookup is bound to when it is.
		dev := want
		if dev == "" {
			dev = st.oif
		}
		if dev == "" {
			dev = "?"
		}
		c.note("fib: no routes known (Env.Routes), " + a.String() + " assumed reachable via " + dev)
		return dev
	}
	r, ok := c.rt.env.route(a)
	if !ok {
		c.note("fib: no route to " + a.String())
		return ""
	}
	if want != "" && r.Dev != want {
		c.note("fib: the route to " + a.String() + " leaves by " + r.Dev + ", not by " + want)
		return ""
	}
	return r.Dev
}

// concatExpr is "a . b . c".
type concatExpr struct {
	parts []expr
	types fieldTypes
}

func (e *concatExpr) typ() fieldTypes { return e.types }

func (e *concatExpr) String() string {
	s := ""
	for i, p := range e.parts {
		if i > 0 {
			s += " . "
		}
		s += p.String()
	}
	return s
}

func (e *concatExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	for _, p := range e.parts {
		var ok bool
		if b, ok = p.eval(c, b); !ok {
			return b, false
		}
	}
	return b, true
}

// binopExpr is "x & m", "x | m", "x ^ m", "x << n", "x >> n" with a constant right side.
type binopExpr struct {
	op  string // &, |, ^, <<, >>
	x   expr
	arg []byte // for &, |, ^
	sh  uint   // for << and >>
	txt string
}

func (e *binopExpr) typ() fieldTypes { return e.x.typ() }
func (e *binopExpr) String() string  { return e.x.String() + " " + e.op + " " + e.txt }

func (e *binopExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	start := len(b)
	b, ok := e.x.eval(c, b)
	if !ok {
		return b, false
	}
	v := b[start:]
	switch e.op {
	case "&":
		for i := range v {
			v[i] &= e.arg[i]
		}
	case "|":
		for i := range v {
			v[i] |= e.arg[i]
		}
	case "^":
		for i := range v {
			v[i] ^= e.arg[i]
		}
	case "<<":
		nftdata.PutUint(v, nftdata.Uint(v)<<e.sh)
	case ">>":
		nftdata.PutUint(v, nftdata.Uint(v)>>e.sh)
	}
	return b, true
}

// constExpr is a literal.
type constExpr struct {
	val   []byte
	types fieldTypes
}

func (e *constExpr) typ() fieldTypes { return e.types }
func (e *constExpr) String() string  { return formatFields(e.types, e.val) }
func (e *constExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	return append(b, e.val...), true
}

// mapExpr is "key map @m" or "key map { k : v, ... }": the data of the element matching key.
type mapExpr struct {
	key expr
	set *setDef
	txt string
}

func (e *mapExpr) typ() fieldTypes { return e.set.data }
func (e *mapExpr) String() string  { return e.txt }

func (e *mapExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	k, ok := e.key.eval(c, c.scratch())
	if !ok {
		return b, false
	}
	h := c.find(e.set, k)
	if h.ix == -1 {
		c.note("no element " + formatFields(e.set.key, k) + " in " + e.set.displayName())
		return b, false
	}
	c.noteElem(e.set, h, k)
	return append(b, h.data...), true
}
