package sim

import (
	"strconv"

	"github.com/nftproxy/nftproxy/nftdata"
)

// Directions a conntrack zone can be limited to (NF_CT_ZONE_DIR_ORIG, _REPL).
const (
	ctDirOriginal = 1
	ctDirReply    = 2
)

// zoneID is the zone "ct [DIR] zone" reads, as nf_ct_zone_id does: the zone's id
// when it applies to the direction asked (or none is asked), else the default zone 0.
func (st *pktState) zoneID(dir string) uint16 {
	switch {
	case dir == "" || st.zoneDir == 0:
		return st.zone
	case dir == "original" && st.zoneDir == ctDirOriginal, dir == "reply" && st.zoneDir == ctDirReply:
		return st.zone
	}
	return 0
}

// ctZoneSetStmt is "ct [original|reply] zone set EXPR": the zone conntrack looks the
// packet up in. Like the kernel's template, it only acts before conntrack has seen
// the packet (a raw-priority chain of prerouting or output).
type ctZoneSetStmt struct {
	dir uint8
	val expr
	txt string
}

func (s *ctZoneSetStmt) String() string { return s.txt }

func (s *ctZoneSetStmt) exec(c *evalCtx) (result, *verdict) {
	v, ok := s.val.eval(c, c.scratch())
	if !ok {
		return rBreak, nil
	}
	if c.st.ctAttached {
		c.note(s.txt + ": conntrack has already seen the packet, so its zone stays " + strconv.Itoa(int(c.st.zone)))
		return rNext, nil
	}
	c.st.zone = uint16(nftdata.Uint(v))
	c.st.zoneDir = s.dir
	return rNext, nil
}

// parseCTZoneSet reads "ct [original|reply] zone set EXPR".
func (rp *ruleParser) parseCTZoneSet(start int) (stmt, error) {
	rp.next() // ct
	s := &ctZoneSetStmt{}
	switch rp.next().text {
	case "original":
		s.dir = ctDirOriginal
		rp.next()
	case "reply":
		s.dir = ctDirReply
		rp.next()
	}
	rp.next() // set
	val, err := rp.parseValue(fieldTypes{nftdata.Integer32})
	if err != nil {
		return nil, err
	}
	s.val = val
	s.txt = rp.textFrom(start)
	return s, nil
}
