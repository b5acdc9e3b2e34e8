package sim

import (
	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/packet"
)

// tcpOption is a TCP option nft names: its kind and the fields it can load, each
// with its offset in the option and width.
type tcpOption struct {
	kind   byte
	fields map[string][2]int
}

var tcpOptions = map[string]tcpOption{
	"eol": {kind: 0}, "nop": {kind: 1},
	"maxseg":    {kind: 2, fields: map[string][2]int{"size": {2, 2}}},
	"window":    {kind: 3, fields: map[string][2]int{"count": {2, 1}}},
	"sack-perm": {kind: 4}, "sack-permitted": {kind: 4},
	"sack": {kind: 5}, "sack0": {kind: 5}, "sack1": {kind: 5}, "sack2": {kind: 5}, "sack3": {kind: 5},
	"timestamp": {kind: 8}, "md5sig": {kind: 19}, "mptcp": {kind: 30}, "fastopen": {kind: 34},
}

// undecidedTCPOptionFields are the fields whose values a packet does not show (the
// timestamps, SACK blocks): matches on them fork.
var undecidedTCPOptionFields = map[string]bool{"tsval": true, "tsecr": true, "left": true, "right": true}

// tcpOptExpr is "tcp option NAME exists|missing" (field "") or a field of the option:
// "tcp option maxseg size", "tcp option window count", "tcp option NAME kind|length".
// A packet carries the options Linux sends: a SYN (or SYN-ACK) maxseg, sack-perm,
// timestamp, nop and window scale 10 (the scale of tcp_rmem's default 32 MiB
// maximum; 7 where that maximum is 6 MiB), any other segment nop, nop
// and timestamp (the 20 and 12 bytes the simulator's packet lengths count). The MSS
// is the interface MTU's: 65495 (IPv6 65476) on lo, 1460 (1440) elsewhere.
type tcpOptExpr struct {
	name  string
	field string
}

func (e *tcpOptExpr) typ() fieldTypes {
	if e.field == "" {
		return fieldTypes{nftdata.Boolean}
	}
	return fieldTypes{nftdata.Integer32}
}

func (e *tcpOptExpr) String() string {
	if e.field == "" {
		return "tcp option " + e.name
	}
	return "tcp option " + e.name + " " + e.field
}

// tcpOptions returns the options of the packet's TCP header: kind to length.
func (st *pktState) tcpOptions() map[byte]byte {
	syn := st.conn == nil && st.declared == packet.CTNew
	if st.flags != 0 {
		syn = st.flags&packet.FlagSYN != 0
	}
	if syn {
		return map[byte]byte{2: 4, 4: 2, 8: 10, 1: 1, 3: 3}
	}
	return map[byte]byte{1: 1, 8: 10}
}

func (e *tcpOptExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	st := c.st
	if st.proto != packet.TCP {
		return b, false
	}
	o := tcpOptions[e.name]
	n, present := st.tcpOptions()[o.kind]
	switch {
	case e.field == "":
		if present {
			return append(b, 1), true
		}
		return append(b, 0), true
	case !present:
		return b, false
	case e.field == "kind":
		return append(b, be32(uint32(o.kind))...), true
	case e.field == "length":
		return append(b, be32(uint32(n))...), true
	case e.field == "count":
		return append(b, be32(10)...), true
	}
	// maxseg size: the MTU's less the headers; lo's 65536 gives 65495 (65476).
	mss := 1460
	if st.fam == packet.IPv6 {
		mss = 1440
	}
	if st.oif == "lo" || st.iif == "lo" {
		mss = 65495
		if st.fam == packet.IPv6 {
			mss = 65476
		}
	}
	return append(b, be32(uint32(mss))...), true
}

// parseTCPOptExpr reads what follows "tcp option": a named option and one of its
// fields, or the name alone (with exists or missing after it).
func (rp *ruleParser) parseTCPOptExpr() (expr, error) {
	rp.next() // option
	nt := rp.next()
	o, ok := tcpOptions[nt.text]
	if nt.kind != tWord || !ok {
		return nil, errAt(nt, "unsupported tcp option %s", nt.show())
	}
	rp.l4proto, rp.l4known = byte(packet.TCP), true
	e := &tcpOptExpr{name: nt.text}
	if f := rp.peek(); f.kind == tWord && (f.text == "kind" || f.text == "length" || o.fields[f.text] != [2]int{}) {
		rp.next()
		e.field = f.text
	} else if f.kind == tWord && undecidedTCPOptionFields[f.text] {
		return nil, errAt(f, "tcp option %s %s: the packet does not show it", nt.text, f.text)
	}
	return e, nil
}

// isUndecidedTCPOption reports whether the rule continues with a match on a TCP
// option field the packet does not show ("tcp option timestamp tsval").
func (rp *ruleParser) isUndecidedTCPOption() bool {
	return rp.isWord(0, "tcp") && rp.isWord(1, "option") && undecidedTCPOptionFields[rp.peekAt(3).text]
}

// parseTCPOptionFork reads a match on a TCP option field the packet does not show
// ("tcp option timestamp tsval 0"): a fork.
func (rp *ruleParser) parseTCPOptionFork(start int, t token) (stmt, error) {
	rp.next() // tcp
	rp.next() // option
	o := rp.next()
	f := rp.next()
	if err := rp.allowFork(t, "tcp option "+o.text+" "+f.text, "the option's values in the connection's segments"); err != nil {
		return nil, err
	}
	return rp.forkMatch(start, t)
}
