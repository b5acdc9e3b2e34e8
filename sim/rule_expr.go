package sim

import (
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/packet"
)

// parseValue reads the value side of a statement: an expression (possibly with a
// map lookup) or a constant of type want.
func (rp *ruleParser) parseValue(want fieldTypes) (expr, error) {
	t := rp.peek()
	if t.kind == tWord && isExprKeyword(t.text) {
		start := rp.i
		e, err := rp.parseExpr()
		if err != nil {
			return nil, err
		}
		if rp.isWord(0, "map") {
			e, err = rp.parseMapExpr(e, start, want)
			if err != nil {
				return nil, err
			}
		}
		if !e.typ().compatible(want) && e.typ().width() != want.width() {
			return nil, errAt(t, "datatype mismatch: expected %s, expression has %s", want, e.typ())
		}
		return e, nil
	}
	return rp.parseConstExpr(want)
}

// parseConstExpr reads a constant (a single value per field) of type ft.
func (rp *ruleParser) parseConstExpr(ft fieldTypes) (expr, error) {
	var val []byte
	for i, ty := range ft {
		if i > 0 {
			if _, err := rp.expectWord("."); err != nil {
				return nil, err
			}
		}
		t := rp.next()
		lo, hi, err := parseConst(ty, t)
		if err != nil {
			return nil, err
		}
		if string(lo) != string(hi) {
			return nil, errAt(t, "a range is not allowed here")
		}
		val = append(val, lo...)
	}
	return &constExpr{val: val, types: ft}, nil
}

// parseMapExpr reads "map @m" or "map { k : v, ... }" after the key expression.
func (rp *ruleParser) parseMapExpr(key expr, start int, data fieldTypes) (expr, error) {
	mt := rp.next() // map
	s, err := rp.parseMapRef(mt, key, data, false)
	if err != nil {
		return nil, err
	}
	return &mapExpr{key: key, set: s, txt: rp.textFrom(start)}, nil
}

// parseMapRef reads @name or an anonymous map after "map"/"vmap". data is the data type
// expected for anonymous maps (nil: infer from the elements).
func (rp *ruleParser) parseMapRef(kw token, key expr, data fieldTypes, verdicts bool) (*setDef, error) {
	t := rp.peek()
	if t.kind == tWord && strings.HasPrefix(t.text, "@") {
		rp.next()
		s, err := rp.namedSet(t)
		if err != nil {
			return nil, err
		}
		if !s.isMap {
			return nil, errAt(t, "%s is a set, not a map", t.text)
		}
		if !key.typ().compatible(s.key) {
			return nil, errAt(t, "datatype mismatch: %s has key %s, expression has %s", t.text, s.key, key.typ())
		}
		isVerdict := len(s.data) == 1 && s.data[0] == nftdata.VerdictType
		if verdicts != isVerdict {
			if verdicts {
				return nil, errAt(t, "%s is not a verdict map", t.text)
			}
			return nil, errAt(t, "%s is a verdict map (use vmap)", t.text)
		}
		return s, nil
	}
	if t.kind != tLBrace {
		return nil, errAt(t, "expected @map or { ... } after %s, found %s", kw.text, t.show())
	}
	if verdicts {
		data = fieldTypes{nftdata.VerdictType}
	}
	if data == nil {
		return nil, errAt(t, "cannot infer the data type of this anonymous map")
	}
	s := &setDef{table: rp.tab, key: key.typ(), data: data, isMap: true, interval: true}
	if err := rp.parseAnonElements(s); err != nil {
		return nil, err
	}
	return s, nil
}

func (rp *ruleParser) namedSet(t token) (*setDef, error) {
	name := strings.TrimPrefix(t.text, "@")
	s, ok := rp.tab.sets[name]
	if !ok {
		return nil, errAt(t, "no such set or map %q in table %s", name, rp.tab.id())
	}
	rp.p.setUses = append(rp.p.setUses, setUse{set: s, ctx: rp.context(t)})
	return s, nil
}

// parseAnonElements reads "{ e, e, ... }" into s and builds its index.
func (rp *ruleParser) parseAnonElements(s *setDef) error {
	open := rp.next()
	if open.kind != tLBrace {
		return errAt(open, `expected "{", found %s`, open.show())
	}
	var cur []token
	for {
		t := rp.next()
		switch t.kind {
		case tEOF:
			return errAt(t, `expected "}", found end of rule`)
		case tLBrace:
			return errAt(t, `unexpected "{"`)
		case tComma, tRBrace:
			if len(cur) > 0 {
				ep := &elemParser{p: rp.p, tab: rp.tab, set: s, toks: cur, rp: rp}
				e, err := ep.parse()
				if err != nil {
					return err
				}
				rp.p.addElem(s, rp.tab, e)
				cur = nil
			} else if t.kind == tComma || len(s.elems) == 0 {
				return errAt(t, "unexpected %s", t.show())
			}
			if t.kind == tRBrace {
				s.build()
				return nil
			}
			continue
		}
		cur = append(cur, t)
	}
}

var exprKeywords = map[string]bool{
	"ip": true, "ip6": true, "tcp": true, "udp": true, "sctp": true, "th": true, "meta": true,
	"icmp": true, "icmpv6": true,
	"ct": true, "numgen": true, "jhash": true, "symhash": true, "fib": true, "mark": true, "iif": true, "iifname": true,
	"oif": true, "oifname": true, "l4proto": true, "nfproto": true, "pkttype": true,
	"skuid": true, "skgid": true, "iiftype": true, "oiftype": true,
}

func isExprKeyword(s string) bool { return exprKeywords[s] }

var unsupportedExprs = map[string]bool{
	"ether": true, "vlan": true,
	"arp": true, "rt": true, "osf": true, "socket": true, "exthdr": true, "ipsec": true,
	"udplite": true, "dccp": true, "ah": true, "esp": true, "comp": true, "hbh": true,
	"frag": true, "dst": true, "mh": true, "srh": true, "igmp": true, "gre": true,
	"vxlan": true, "geneve": true, "gretap": true, "cgroupv2": true,
	"cpu":      true,
	"iifgroup": true, "oifgroup": true, "rtclassid": true, "cgroup": true,
	"priority": true, "random": true, "ibrname": true, "obrname": true,
	"sdif": true, "sdifname": true, "secpath": true, "time": true, "day": true, "hour": true,
}

// parseExpr reads an expression: terms joined by "." into a concatenation.
func (rp *ruleParser) parseExpr() (expr, error) {
	first, err := rp.parseBinop()
	if err != nil {
		return nil, err
	}
	parts := []expr{first}
	for rp.isWord(0, ".") {
		rp.next()
		x, err := rp.parseBinop()
		if err != nil {
			return nil, err
		}
		parts = append(parts, x)
	}
	if len(parts) == 1 {
		return first, nil
	}
	c := &concatExpr{parts: parts}
	for _, p := range parts {
		c.types = append(c.types, p.typ()...)
	}
	return c, nil
}

var binops = map[string]string{"&": "&", "and": "&", "|": "|", "or": "|", "^": "^", "xor": "^", "<<": "<<", "lshift": "<<", ">>": ">>", "rshift": ">>"}

// parseBinop reads a primary expression followed by bitwise operations with constants.
func (rp *ruleParser) parseBinop() (expr, error) {
	x, err := rp.parsePrimary()
	if err != nil {
		return nil, err
	}
	for {
		t := rp.peek()
		op, ok := binops[t.text]
		if !ok || (t.kind != tWord && t.kind != tOp) {
			return x, nil
		}
		rp.next()
		ft := x.typ()
		if len(ft) != 1 || (ft[0].Kind() != nftdata.KindInteger && !((op == "&" || op == "|" || op == "^") && (ft[0].Kind() == nftdata.KindIPv4 || ft[0].Kind() == nftdata.KindIPv6))) {
			return nil, errAt(t, "bitwise %s needs an integer expression, %s is %s", t.text, x, ft)
		}
		at := rp.next()
		b := &binopExpr{op: op, x: x, txt: at.text}
		if op == "<<" || op == ">>" {
			n, err := strconv.ParseUint(at.text, 0, 8)
			if err != nil || int(n) >= 8*ft[0].Width() {
				return nil, errAt(at, "bad shift %s", at.show())
			}
			b.sh = uint(n)
		} else if syms := symbolsOf(x); syms != nil && syms[0] != nil {
			atIx := rp.i - 1
			v, err := rp.parseSymBits(ft[0], syms[0], at, false)
			if err != nil {
				return nil, err
			}
			b.arg, b.txt = v, rp.textFrom(atIx)
		} else {
			v, err := ft[0].Parse(at.text)
			if err != nil || at.kind != tWord {
				return nil, errAt(at, "bad %s operand %s", ft[0].Name(), at.show())
			}
			b.arg = v
		}
		x = b
	}
}

// parsePrimary reads one expression: a payload field, a meta or ct key, numgen, fib.
func (rp *ruleParser) parsePrimary() (expr, error) {
	t := rp.next()
	if t.kind != tWord {
		return nil, errAt(t, "expected an expression, found %s", t.show())
	}
	field := func(allowed ...string) (token, error) {
		f := rp.next()
		for _, a := range allowed {
			if f.kind == tWord && f.text == a {
				return f, nil
			}
		}
		if f.kind == tWord {
			return f, errAt(f, "unsupported %s field %q (supported: %s)", t.text, f.text, strings.Join(allowed, ", "))
		}
		return f, errAt(f, "expected a %s field, found %s", t.text, f.show())
	}
	switch t.text {
	case "ip":
		f, err := field("saddr", "daddr", "protocol", "ttl", "dscp", "length", "version", "frag-off")
		if err != nil {
			return nil, err
		}
		if rp.tab != nil && rp.tab.family == "ip6" {
			return nil, errAt(t, "ip %s in an ip6 table", f.text)
		}
		switch f.text {
		case "saddr", "daddr", "protocol":
			return &ipField{fam: packet.IPv4, field: f.text}, nil
		}
		return &ipHdrField{fam: packet.IPv4, field: f.text}, nil
	case "ip6":
		f, err := field("saddr", "daddr", "nexthdr", "hoplimit", "dscp", "length", "version")
		if err != nil {
			return nil, err
		}
		if rp.tab != nil && rp.tab.family == "ip" {
			return nil, errAt(t, "ip6 %s in an ip table", f.text)
		}
		switch f.text {
		case "saddr", "daddr", "nexthdr":
			return &ipField{fam: packet.IPv6, field: f.text}, nil
		}
		return &ipHdrField{fam: packet.IPv6, field: f.text}, nil
	case "icmp", "icmpv6":
		f, err := field("type", "code")
		if err != nil {
			return nil, err
		}
		proto := packet.ICMP
		if t.text == "icmpv6" {
			proto = packet.ICMPv6
		}
		rp.l4proto, rp.l4known = byte(proto), true
		return &icmpField{proto: proto, field: f.text}, nil
	case "tcp", "udp", "sctp", "th":
		if t.text == "tcp" && rp.isWord(0, "option") {
			return rp.parseTCPOptExpr()
		}
		allowed := []string{"sport", "dport"}
		if t.text == "tcp" {
			allowed = append(allowed, "flags")
		}
		f, err := field(allowed...)
		if err != nil {
			return nil, err
		}
		// th is any transport header; the others name their protocol.
		n, ok := nftdata.ProtocolNumber(t.text)
		if ok {
			// A transport header field implies "meta l4proto P".
			rp.l4proto, rp.l4known = n, true
		}
		if f.text == "flags" {
			return &tcpFlagsExpr{}, nil
		}
		return &thField{proto: packet.Protocol(n), field: f.text}, nil
	case "meta":
		k := rp.next()
		if k.kind == tWord {
			if _, ok := metaTypes[k.text]; ok {
				return &metaExpr{key: k.text}, nil
			}
		}
		return nil, errAt(k, "unsupported meta key %s", k.show())
	case "mark", "iif", "iifname", "oif", "oifname", "l4proto", "nfproto", "pkttype", "skuid", "skgid", "iiftype", "oiftype":
		return &metaExpr{key: t.text}, nil
	case "ct":
		return rp.parseCT(t)
	case "numgen":
		return rp.parseNumgen()
	case "jhash", "symhash":
		return rp.parseHash(t)
	case "fib":
		return rp.parseFib()
	}
	if strings.HasPrefix(t.text, "$") {
		return nil, errAt(t, "variables are not supported")
	}
	if unsupportedExprs[t.text] {
		return nil, errAt(t, "unsupported expression %q", t.text)
	}
	return nil, errAt(t, "unknown expression %q", t.text)
}

func (rp *ruleParser) parseCT(ct token) (expr, error) {
	e := &ctExpr{}
	k := rp.next()
	if k.kind == tWord && (k.text == "original" || k.text == "reply") {
		e.dir = k.text
		k = rp.next()
	}
	if k.kind == tWord && (k.text == "ip" || k.text == "ip6") {
		e.fam = packet.IPv4
		if k.text == "ip6" {
			e.fam = packet.IPv6
		}
		k = rp.next()
		if k.kind != tWord || (k.text != "saddr" && k.text != "daddr") {
			return nil, errAt(k, "expected saddr or daddr, found %s", k.show())
		}
	}
	if k.kind != tWord {
		return nil, errAt(k, "expected a ct key, found %s", k.show())
	}
	e.key = k.text
	switch k.text {
	case "state":
		e.vtyp = nftdata.CTState
	case "status":
		e.vtyp = nftdata.CTStatus
	case "mark":
		e.vtyp = nftdata.Mark
	case "direction":
		e.vtyp = nftdata.CTDir
	case "l3proto":
		e.vtyp = nftdata.NFProto
	case "protocol":
		e.vtyp = nftdata.InetProto
	case "zone":
		e.vtyp = nftdata.Integer32
	case "proto-src", "proto-dst":
		if err := rp.checkPortContext(ct, e); err != nil {
			return nil, err
		}
		e.vtyp = nftdata.InetService
	case "saddr", "daddr":
		if e.dir == "" {
			return nil, errAt(k, "ct %s needs a direction (original or reply)", k.text)
		}
		if e.fam == 0 {
			switch rp.tab.family {
			case "ip":
				e.fam = packet.IPv4
			case "ip6":
				e.fam = packet.IPv6
			default:
				return nil, errAt(k, "ct %s %s in an inet table needs ip or ip6", e.dir, k.text)
			}
		}
		e.vtyp = nftdata.IPv4Addr
		if e.fam == packet.IPv6 {
			e.vtyp = nftdata.IPv6Addr
		}
	default:
		return nil, errAt(k, "unsupported ct key %q", k.text)
	}
	if e.dir != "" && (e.key == "state" || e.key == "status" || e.key == "mark" || e.key == "direction") {
		return nil, errAt(k, "ct %s has no direction", e.key)
	}
	return e, nil
}

// portProtos are the transport protocols whose conntrack tuples carry ports.
var portProtos = map[string]bool{"tcp": true, "udp": true, "sctp": true, "dccp": true, "udplite": true}

// checkPortContext checks that a rule has established a protocol with ports before
// ct proto-src or proto-dst, which nft cannot type otherwise ("can not use variable
// sized data types (invalid) in concat expressions"). nft lists such rules without
// the "meta l4proto tcp" they were written with when a later "tcp dport" implies it,
// so a transport header field later in the rule is accepted too. Declarations
// (typeof) are not checked.
func (rp *ruleParser) checkPortContext(ct token, e *ctExpr) error {
	if rp.chain == nil {
		return nil
	}
	if rp.l4known {
		name := nftdata.InetProto.Format([]byte{rp.l4proto})
		if !portProtos[name] {
			return errAt(ct, "%s: protocol %s has no ports", e, name)
		}
		return nil
	}
	for j := rp.i; j+1 < len(rp.toks); j++ {
		if a, b := rp.toks[j], rp.toks[j+1]; a.kind == tWord && portProtos[a.text] && b.kind == tWord && (b.text == "sport" || b.text == "dport") {
			return nil
		}
	}
	return errAt(ct, `%s has no type without a transport protocol: match "meta l4proto tcp" (or udp, sctp) earlier in the rule`, e)
}

func (rp *ruleParser) parseNumgen() (expr, error) {
	m := rp.next()
	if m.kind != tWord || (m.text != "random" && m.text != "inc") {
		return nil, errAt(m, "expected random or inc after numgen, found %s", m.show())
	}
	if _, err := rp.expectWord("mod"); err != nil {
		return nil, err
	}
	nt := rp.next()
	n, err := strconv.ParseUint(nt.text, 0, 32)
	if err != nil || n == 0 || nt.kind != tWord {
		return nil, errAt(nt, "bad numgen modulus %s", nt.show())
	}
	// The site names the expression by table, chain, rule text and position, so that
	// a Runtime keeps its counter when it loads a new version of the ruleset.
	site := strconv.Itoa(rp.i)
	if rp.tab != nil {
		site = rp.tab.id() + "\x00" + site
	}
	if rp.chain != nil {
		site += "\x00" + rp.chain.name + "\x00" + rp.text
	}
	e := &numgenExpr{random: m.text == "random", mod: uint32(n), site: site}
	if rp.isWord(0, "offset") {
		rp.next()
		ot := rp.next()
		o, err := strconv.ParseUint(ot.text, 0, 32)
		if err != nil || ot.kind != tWord {
			return nil, errAt(ot, "bad numgen offset %s", ot.show())
		}
		e.offset = uint32(o)
	}
	return e, nil
}

func (rp *ruleParser) parseFib() (expr, error) {
	a := rp.next()
	if a.kind != tWord || (a.text != "saddr" && a.text != "daddr") {
		return nil, errAt(a, "expected saddr or daddr after fib, found %s", a.show())
	}
	e := &fibExpr{addr: a.text}
	for rp.isWord(0, ".") && (rp.isWord(1, "iif") || rp.isWord(1, "oif") || rp.isWord(1, "mark")) {
		rp.next()
		e.extra += " . " + rp.next().text
	}
	r := rp.next()
	if r.kind != tWord || (r.text != "type" && r.text != "oif" && r.text != "oifname") {
		return nil, errAt(r, "expected type, oif or oifname in fib expression, found %s", r.show())
	}
	e.result = r.text
	return e, nil
}

// parseSymBits reads a value of a symbolic type starting at first (already read):
// NAME or number, "NAME | NAME ...", "( NAME | NAME ... )", and with commas when
// commas is set ("syn,ack"); the names' values are ORed together.
func (rp *ruleParser) parseSymBits(t *nftdata.Type, syms symbols, first token, commas bool) ([]byte, error) {
	paren := first.kind == tOp && first.text == "("
	tok := first
	if paren {
		tok = rp.next()
	}
	var out []byte
	for {
		lo, hi, err := parseSymConst(t, syms, tok)
		if err != nil {
			return nil, err
		}
		if string(lo) != string(hi) {
			return nil, errAt(tok, "a range is not allowed here")
		}
		if out == nil {
			out = lo
		} else {
			for i := range out {
				out[i] |= lo[i]
			}
		}
		n := rp.peek()
		if (n.kind == tOp && n.text == "|") || (n.kind == tComma && (commas || paren)) {
			rp.next()
			tok = rp.next()
			continue
		}
		break
	}
	if paren {
		if c := rp.next(); c.kind != tOp || c.text != ")" {
			return nil, errAt(c, `expected ")", found %s`, c.show())
		}
	}
	return out, nil
}
