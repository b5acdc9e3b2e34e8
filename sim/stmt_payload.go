package sim

import (
	"net/netip"

	"github.com/nftproxy/nftproxy/nftdata"
)

// payloadSetStmt is "ip|ip6 saddr|daddr set EXPR" or "tcp|udp|sctp|th sport|dport set
// EXPR": stateless NAT, rewriting the packet's header. Conntrack does not learn of
// it: the connection keeps the tuple it saw, and replies are not translated back.
type payloadSetStmt struct {
	field expr // *ipField or *thField
	val   expr
	txt   string
}

func (s *payloadSetStmt) String() string { return s.txt }

func (s *payloadSetStmt) exec(c *evalCtx) (result, *verdict) {
	// The field must load (its family or protocol) for the statement to apply, as
	// nft's implied dependency (meta nfproto, meta l4proto) requires.
	if _, ok := s.field.eval(c, c.scratch()); !ok {
		return rBreak, nil
	}
	v, ok := s.val.eval(c, c.scratch())
	if !ok {
		return rBreak, nil
	}
	st := c.st
	switch f := s.field.(type) {
	case *ipField:
		a, _ := netip.AddrFromSlice(v)
		if f.field == "saddr" {
			st.src = netip.AddrPortFrom(a, st.src.Port())
		} else {
			st.dst = netip.AddrPortFrom(a, st.dst.Port())
		}
	case *thField:
		p := uint16(nftdata.Uint(v))
		if f.field == "sport" {
			st.src = netip.AddrPortFrom(st.src.Addr(), p)
		} else {
			st.dst = netip.AddrPortFrom(st.dst.Addr(), p)
		}
	}
	c.note("the header is rewritten; conntrack keeps the tuple it saw")
	return rNext, nil
}

// parsePayloadSet reads the value of "FIELD set VALUE" after "set", for the address
// and port fields.
func (rp *ruleParser) parsePayloadSet(start int, lhs expr) (stmt, error) {
	val, err := rp.parseValue(lhs.typ())
	if err != nil {
		return nil, err
	}
	return &payloadSetStmt{field: lhs, val: val, txt: rp.textFrom(start)}, nil
}
