package sim

import (
	"bytes"
	"fmt"
	"net/netip"
	"time"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/packet"
)

// verdictKind is what a rule, chain or map element decides.
type verdictKind uint8

const (
	vContinue verdictKind = iota
	vAccept
	vDrop
	vReject
	vReturn
	vJump
	vGoto
	// vStolen: fwd sent the packet out of device chainName.
	vStolen
)

// verdict is a verdict statement or verdict-map datum.
type verdict struct {
	kind      verdictKind
	chainName string
	chain     *chain // resolved after all chains are known
	reject    string // for vReject: "icmp port-unreachable", "tcp reset", ...
	tok       token  // where the chain was named, for errors
}

func (v *verdict) String() string {
	switch v.kind {
	case vAccept:
		return "accept"
	case vDrop:
		return "drop"
	case vReject:
		if v.reject == "" {
			return "reject"
		}
		return "reject with " + v.reject
	case vReturn:
		return "return"
	case vJump:
		return "jump " + v.chainName
	case vGoto:
		return "goto " + v.chainName
	case vStolen:
		return "fwd to " + v.chainName
	}
	return "continue"
}

// result is how a statement ends.
type result uint8

const (
	rNext    result = iota // go on with the next statement
	rBreak                 // the rule does not match
	rVerdict               // the statement issued a verdict
)

// stmt is one compiled statement of a rule.
type stmt interface {
	exec(c *evalCtx) (result, *verdict)
	String() string
}

// matchOp is a relational operator.
type matchOp uint8

const (
	opImplicit matchOp = iota
	opEq
	opNeq
	opLt
	opGt
	opLe
	opGe
	opNone // "!" on a bitmask: none of the bits; compiled to (x & bits) == 0
)

// matchStmt compares an expression with a value, a range, or a set.
type matchStmt struct {
	lhs    expr
	op     matchOp
	lo, hi []byte  // value or range (when set == nil)
	set    *setDef // anonymous or named set lookup
	bits   bool    // bitmask semantics: (lhs & lo) != 0
	txt    string
	// und, when set, may say the packet cannot decide the match: the trace forks.
	und interface{ undecided(*evalCtx) string }
}

func (s *matchStmt) String() string { return s.txt }

func (s *matchStmt) exec(c *evalCtx) (result, *verdict) {
	if s.und != nil {
		if why := s.und.undecided(c); why != "" {
			if c.fork(s.txt, [2]string{s.txt + " holds (" + why + ")", s.txt + " does not hold (" + why + ")"}) == 0 {
				return rNext, nil
			}
			return rBreak, nil
		}
	}
	v, ok := s.lhs.eval(c, c.scratch())
	if !ok {
		return rBreak, nil
	}
	var m bool
	switch {
	case s.set != nil:
		h := c.find(s.set, v)
		m = h.ix != -1
		if m && s.set.name != "" {
			c.noteElem(s.set, h, v)
		}
		if s.op == opNeq {
			m = !m
		}
	case s.bits:
		any := false
		zero := true
		for i := range v {
			if v[i]&s.lo[i] != 0 {
				any = true
			}
			if s.lo[i] != 0 {
				zero = false
			}
		}
		if zero {
			any = bytes.Equal(v, s.lo)
		}
		m = any
		if s.op == opNeq {
			m = !m
		}
	default:
		in := bytes.Compare(v, s.lo) >= 0 && bytes.Compare(v, s.hi) <= 0
		switch s.op {
		case opImplicit, opEq:
			m = in
		case opNeq:
			m = !in
		case opLt:
			m = bytes.Compare(v, s.lo) < 0
		case opGt:
			m = bytes.Compare(v, s.hi) > 0
		case opLe:
			m = bytes.Compare(v, s.hi) <= 0
		case opGe:
			m = bytes.Compare(v, s.lo) >= 0
		}
	}
	if !m {
		return rBreak, nil
	}
	return rNext, nil
}

// vmapStmt is "key vmap @m" / "key vmap { k : verdict, ... }".
type vmapStmt struct {
	key expr
	set *setDef
	txt string
}

func (s *vmapStmt) String() string { return s.txt }

func (s *vmapStmt) exec(c *evalCtx) (result, *verdict) {
	k, ok := s.key.eval(c, c.scratch())
	if !ok {
		return rBreak, nil
	}
	h := c.find(s.set, k)
	if h.ix < 0 {
		// dynElemIx cannot happen: verdict maps are not updated from the packet path.
		c.note("no element " + formatFields(s.set.key, k) + " in " + s.set.displayName())
		return rBreak, nil
	}
	c.noteElem(s.set, h, k)
	return rVerdict, s.set.verdictOf(&s.set.elems[h.ix])
}

// verdictStmt is accept, drop, reject, jump, goto, return, continue.
type verdictStmt struct{ v *verdict }

func (s *verdictStmt) String() string { return s.v.String() }
func (s *verdictStmt) exec(c *evalCtx) (result, *verdict) {
	if s.v.kind == vContinue {
		return rNext, nil
	}
	return rVerdict, s.v
}

// noopStmt is a statement with no effect on the packet's path: counter, log, comment,
// meta nftrace set.
type noopStmt struct {
	txt     string
	nftrace bool
}

func (s *noopStmt) String() string { return s.txt }
func (s *noopStmt) exec(c *evalCtx) (result, *verdict) {
	if s.nftrace {
		c.st.nftrace = true
	}
	return rNext, nil
}

// notrackStmt is "notrack": the packet skips conntrack if it is not tracked yet.
type notrackStmt struct{}

func (s *notrackStmt) String() string { return "notrack" }
func (s *notrackStmt) exec(c *evalCtx) (result, *verdict) {
	if !c.st.ctAttached {
		c.st.untracked = true
	}
	return rNext, nil
}

// setMetaStmt is "meta mark set EXPR" / "ct mark set EXPR".
type setMetaStmt struct {
	target string // mark, ctmark
	val    expr
	txt    string
}

func (s *setMetaStmt) String() string { return s.txt }
func (s *setMetaStmt) exec(c *evalCtx) (result, *verdict) {
	v, ok := s.val.eval(c, c.scratch())
	if !ok {
		return rBreak, nil
	}
	m := uint32(nftdata.Uint(v))
	switch s.target {
	case "mark":
		c.st.mark = m
	case "ctmark":
		if c.st.hasConn() {
			c.st.ctMark = m
		}
	}
	return rNext, nil
}

// natKind is the kind of a NAT statement.
type natKind uint8

const (
	natDNAT natKind = iota
	natSNAT
	natMasquerade
	natRedirect
)

// natStmt is dnat, snat, masquerade or redirect. Like the kernel's nft_nat, it ends
// the rule with accept once the binding is set up.
type natStmt struct {
	kind natKind
	fam  packet.Family // 0: any; else the statement only applies to this family
	addr expr          // address, or address . port from a map; nil for masquerade/redirect
	port expr          // port, when given separately (the low end of a range)
	// portHi is the high end of a port range ("to :1000-2000"), 0 for one port.
	portHi uint16
	// addrPort says addr yields address . port (a map with concatenated data).
	addrPort bool
	txt      string
}

func (s *natStmt) String() string { return s.txt }

func (s *natStmt) exec(c *evalCtx) (result, *verdict) {
	if s.fam != 0 && s.fam != c.st.fam {
		return rBreak, nil
	}
	var addr netip.Addr
	var port uint16
	hasPort := false
	if s.addr != nil {
		v, ok := s.addr.eval(c, c.scratch())
		if !ok {
			return rBreak, nil
		}
		aw := 4
		if c.st.fam == packet.IPv6 {
			aw = 16
		}
		if len(v) < aw {
			c.note("address of the wrong family")
			return rBreak, nil
		}
		addr, _ = netip.AddrFromSlice(v[:aw])
		if s.addrPort && len(v) >= aw+2 {
			port = uint16(v[aw])<<8 | uint16(v[aw+1])
			hasPort = true
		}
	}
	if s.port != nil {
		v, ok := s.port.eval(c, c.scratch())
		if !ok {
			return rBreak, nil
		}
		port = uint16(nftdata.Uint(v))
		hasPort = true
		if s.portHi != 0 {
			port = c.rangePort(s, port)
		}
	}
	return c.natSetup(s, addr, port, hasPort)
}

// setUpdateStmt is "add|update|delete @set { key [timeout T] }", or for a map
// "add|update|delete @map { key [timeout T] : data }".
type setUpdateStmt struct {
	op      string // add, update, delete
	set     *setDef
	key     expr
	data    expr          // the element's data, for maps (nil for sets)
	timeout time.Duration // 0: the set's default
	// stateful is the element's limit, quota or ct count, nil for none.
	stateful *forkStmt
	txt      string
}

func (s *setUpdateStmt) String() string { return s.txt }
func (s *setUpdateStmt) exec(c *evalCtx) (result, *verdict) {
	k, ok := s.key.eval(c, c.scratch())
	if !ok {
		return rBreak, nil
	}
	var d []byte
	if s.data != nil {
		// A data expression that cannot be loaded ends the rule, as a key does.
		if d, ok = s.data.eval(c, c.scratch()); !ok {
			return rBreak, nil
		}
	}
	c.setUpdate(s, k, d)
	if s.stateful != nil {
		return s.stateful.exec(c)
	}
	return rNext, nil
}

// rangePort picks the port of a NAT to the range lo-s.portHi: like nf_nat, the
// packet's own port when it is in the range; else the kernel takes a free one, and
// the simulator, which sees no other connections, the first.
func (c *evalCtx) rangePort(s *natStmt, lo uint16) uint16 {
	own := c.st.src.Port()
	if s.kind == natDNAT || s.kind == natRedirect {
		own = c.st.dst.Port()
	}
	if own >= lo && own <= s.portHi {
		return own
	}
	c.note(fmt.Sprintf("port %d is outside %d-%d: the kernel takes a free port of the range, the simulator the first", own, lo, s.portHi))
	return lo
}
