package sim

import (
	"fmt"
	"net/netip"
	"sort"

	"github.com/nftproxy/nftproxy/packet"
)

// Tuple is one direction of a connection: protocol, source and destination.
type Tuple struct {
	Proto    packet.Protocol
	Src, Dst netip.AddrPort
}

// String renders the tuple like a packet: "tcp 10.0.0.5:40000 -> 10.1.0.5:8080".
func (t Tuple) String() string {
	return packet.Packet{Protocol: t.Proto, Src: t.Src, Dst: t.Dst}.String()
}

// Conn is a conntrack entry: a connection the Runtime has seen the first packet of.
// Later packets matching Original (or Reply) skip the nat chains and are translated as
// the first packet was (or back).
type Conn struct {
	// Original is the first packet's tuple before any NAT.
	Original Tuple
	// Reply is the tuple replies carry: the original after DNAT and SNAT, reversed.
	Reply Tuple
	// DNAT and SNAT say which translations the first packet got; Masquerade says the
	// SNAT was a masquerade.
	DNAT, SNAT, Masquerade bool
	// Mark is the connection mark (ct mark).
	Mark uint32
	// Zone is the conntrack zone the entry lives in; packets of other zones do not
	// find it.
	Zone uint16
}

// String renders the entry as "ORIGINAL => REPLY [dnat] [snat]".
func (c Conn) String() string {
	s := fmt.Sprintf("%s reply %s", c.Original, c.Reply)
	if c.DNAT {
		s += " dnat"
	}
	if c.SNAT {
		s += " snat"
	}
	if c.Masquerade {
		s += " masquerade"
	}
	return s
}

// conntrack is the Runtime's connection table.
type conntrack struct {
	byTuple map[Tuple]ctRef
	conns   []*Conn
}

type ctRef struct {
	conn  *Conn
	reply bool
}

func newConntrack() *conntrack { return &conntrack{byTuple: map[Tuple]ctRef{}} }

func (ct *conntrack) lookup(t Tuple) (*Conn, bool, bool) {
	r, ok := ct.byTuple[t]
	return r.conn, r.reply, ok
}

// add inserts c unless either of its tuples is taken (a clash the kernel would drop).
func (ct *conntrack) add(c *Conn) bool {
	if _, ok := ct.byTuple[c.Original]; ok {
		return false
	}
	if _, ok := ct.byTuple[c.Reply]; ok {
		return false
	}
	ct.byTuple[c.Original] = ctRef{conn: c}
	ct.byTuple[c.Reply] = ctRef{conn: c, reply: true}
	ct.conns = append(ct.conns, c)
	return true
}

func (ct *conntrack) list() []Conn {
	out := make([]Conn, 0, len(ct.conns))
	for _, c := range ct.conns {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Original.String() < out[j].Original.String() })
	return out
}
