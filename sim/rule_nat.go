package sim

import (
	"strings"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/packet"
)

// parseNat reads dnat, snat, masquerade and redirect statements.
func (rp *ruleParser) parseNat() (stmt, error) {
	start := rp.i
	kw := rp.next()
	s := &natStmt{}
	switch kw.text {
	case "dnat":
		s.kind = natDNAT
	case "snat":
		s.kind = natSNAT
	case "masquerade":
		s.kind = natMasquerade
	case "redirect":
		s.kind = natRedirect
	}
	var fam packet.Family
	if s.kind == natDNAT || s.kind == natSNAT {
		if rp.isWord(0, "ip") || rp.isWord(0, "ip6") {
			fam = packet.IPv4
			if rp.next().text == "ip6" {
				fam = packet.IPv6
			}
		}
		if fam == 0 {
			switch rp.tab.family {
			case "ip":
				fam = packet.IPv4
			case "ip6":
				fam = packet.IPv6
			}
		}
		if _, err := rp.expectWord("to"); err != nil {
			return nil, err
		}
		if err := rp.parseNatTarget(s, &fam); err != nil {
			return nil, err
		}
	} else if rp.isWord(0, "to") {
		rp.next()
		pt := rp.next()
		if pt.kind != tWord || !strings.HasPrefix(pt.text, ":") {
			return nil, errAt(pt, "expected :PORT after %s to, found %s", kw.text, pt.show())
		}
		lo, hi, err := parseConst(nftdata.InetService, token{kind: tWord, text: pt.text[1:], off: pt.off + 1, line: pt.line, col: pt.col + 1})
		if err != nil {
			return nil, err
		}
		s.port = &constExpr{val: lo, types: fieldTypes{nftdata.InetService}}
		if string(lo) != string(hi) {
			s.portHi = uint16(nftdata.Uint(hi))
		}
	}
	for {
		t := rp.peek()
		if t.kind == tWord && (t.text == "random" || t.text == "fully-random" || t.text == "persistent") {
			rp.next()
			if rp.peek().kind == tComma {
				rp.next()
			}
			continue
		}
		break
	}
	s.fam = fam
	s.txt = rp.textFrom(start)
	return s, nil
}

// parseNatTarget reads the target after "dnat|snat [ip|ip6] to".
func (rp *ruleParser) parseNatTarget(s *natStmt, fam *packet.Family) error {
	t := rp.peek()
	addrType := func(f packet.Family) *nftdata.Type {
		if f == packet.IPv6 {
			return nftdata.IPv6Addr
		}
		return nftdata.IPv4Addr
	}
	if t.kind == tWord && isExprKeyword(t.text) {
		start := rp.i
		key, err := rp.parseExpr()
		if err != nil {
			return err
		}
		if !rp.isWord(0, "map") {
			if !key.typ().compatible(fieldTypes{addrType(*fam)}) {
				return errAt(t, "%s is not an address", key)
			}
			s.addr = key
			return nil
		}
		var want fieldTypes
		if n := rp.peekAt(1); n.kind == tLBrace {
			// Anonymous map: data is ADDR, or ADDR . PORT if the elements say so.
			want = fieldTypes{addrType(*fam)}
			for j := rp.i; j < len(rp.toks) && rp.toks[j].kind != tRBrace; j++ {
				if rp.toks[j].kind == tColon {
					for k := j + 1; k < len(rp.toks) && rp.toks[k].kind != tComma && rp.toks[k].kind != tRBrace; k++ {
						if rp.toks[k].kind == tWord && rp.toks[k].text == "." {
							want = append(want, nftdata.InetService)
							break
						}
					}
					break
				}
			}
		}
		me, err := rp.parseMapExpr(key, start, want)
		if err != nil {
			return err
		}
		data := me.typ()
		switch {
		case len(data) == 1 && (data[0].Kind() == nftdata.KindIPv4 || data[0].Kind() == nftdata.KindIPv6):
		case len(data) == 2 && (data[0].Kind() == nftdata.KindIPv4 || data[0].Kind() == nftdata.KindIPv6) && data[1].Width() == 2:
			s.addrPort = true
		default:
			return errAt(t, "map data %s is not an address or address . port", data)
		}
		if *fam == 0 {
			*fam = packet.IPv4
			if data[0].Kind() == nftdata.KindIPv6 {
				*fam = packet.IPv6
			}
		} else if addrType(*fam).Kind() != data[0].Kind() {
			return errAt(t, "map data %s is not of the statement's family", data)
		}
		s.addr = me
		return nil
	}
	rp.next()
	if t.kind != tWord {
		return errAt(t, "expected an address, found %s", t.show())
	}
	text := t.text
	var addrText, portText string
	switch {
	case strings.HasPrefix(text, ":"):
		portText = text[1:]
	case strings.HasPrefix(text, "["):
		end := strings.Index(text, "]")
		if end < 0 {
			return errAt(t, "bad address %q", text)
		}
		addrText = text[1:end]
		rest := text[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return errAt(t, "bad address %q", text)
			}
			portText = rest[1:]
		}
	case strings.Count(text, ":") == 1:
		i := strings.IndexByte(text, ':')
		addrText, portText = text[:i], text[i+1:]
	default:
		addrText = text
	}
	if addrText != "" {
		if strings.Contains(addrText, "-") {
			return errAt(t, "address ranges in %s are not supported", s.kindName())
		}
		f := packet.IPv4
		if strings.Contains(addrText, ":") {
			f = packet.IPv6
		}
		if *fam == 0 {
			*fam = f
		}
		v, err := addrType(*fam).Parse(addrText)
		if err != nil {
			return errAt(t, "bad %s address %q", addrType(*fam).Name(), addrText)
		}
		s.addr = &constExpr{val: v, types: fieldTypes{addrType(*fam)}}
	}
	if portText != "" {
		lo, hi, err := nftdata.InetService.ParseRange(portText)
		if err != nil {
			return errAt(t, "bad port %q", portText)
		}
		s.port = &constExpr{val: lo, types: fieldTypes{nftdata.InetService}}
		if string(lo) != string(hi) {
			s.portHi = uint16(nftdata.Uint(hi))
		}
	}
	return nil
}

func (s *natStmt) kindName() string {
	return [...]string{"dnat", "snat", "masquerade", "redirect"}[s.kind]
}
