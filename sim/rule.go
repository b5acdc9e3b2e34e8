package sim

import (
	"errors"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/packet"
)

// ruleParser compiles the tokens of one rule (or a typeof declaration) into
// statements and expressions.
type ruleParser struct {
	p       *parser
	tab     *table
	chain   *chain
	toks    []token
	i       int
	ruleIdx int
	text    string
	// l4proto is the transport protocol the rule has established so far ("meta
	// l4proto tcp", "tcp dport ...", "ct protocol udp"), when l4known: it gives ct
	// proto-src and proto-dst their type, as nft's protocol context does.
	l4proto byte
	l4known bool
}

func (rp *ruleParser) atEnd() bool { return rp.i >= len(rp.toks) }

func (rp *ruleParser) eofTok() token {
	if len(rp.toks) == 0 {
		return token{kind: tEOF}
	}
	last := rp.toks[len(rp.toks)-1]
	return token{kind: tEOF, off: last.end + 1, end: last.end + 1, line: last.line, col: last.col + (last.end - last.off) + 1}
}

func (rp *ruleParser) peek() token {
	if rp.atEnd() {
		return rp.eofTok()
	}
	return rp.toks[rp.i]
}

func (rp *ruleParser) peekAt(n int) token {
	if rp.i+n >= len(rp.toks) {
		return rp.eofTok()
	}
	return rp.toks[rp.i+n]
}

func (rp *ruleParser) next() token {
	t := rp.peek()
	if !rp.atEnd() {
		rp.i++
	}
	return t
}

func (rp *ruleParser) isWord(n int, w string) bool {
	t := rp.peekAt(n)
	return t.kind == tWord && t.text == w
}

func (rp *ruleParser) expectWord(w string) (token, error) {
	t := rp.next()
	if t.kind != tWord || t.text != w {
		return t, errAt(t, "expected %q, found %s", w, t.show())
	}
	return t, nil
}

// textFrom returns the source text from token index start to the current position.
func (rp *ruleParser) textFrom(start int) string {
	if start >= rp.i || start >= len(rp.toks) {
		return ""
	}
	return rp.p.src[rp.toks[start].off:rp.toks[rp.i-1].end]
}

// wrap turns a positioned error into a CompileError naming table, chain and rule.
func (rp *ruleParser) wrap(err error) error {
	var pe *posError
	if !errors.As(err, &pe) {
		return err
	}
	ce := &CompileError{Rule: -1, Line: pe.tok.line, Column: pe.tok.col, Msg: pe.msg}
	if rp.tab != nil {
		ce.Table = rp.tab.id()
	}
	if rp.chain != nil {
		ce.Chain = rp.chain.name
		ce.Rule = rp.ruleIdx
		ce.RuleText = rp.text
		if len(rp.toks) > 0 {
			ce.Column = pe.tok.off - rp.toks[0].off + 1
		}
	}
	return ce
}

func (rp *ruleParser) parseRule() ([]stmt, error) {
	var out []stmt
	for !rp.atEnd() {
		s, err := rp.parseStmt()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

var unsupportedStmts = map[string]bool{
	"limit": true, "quota": true, "queue": true, "fwd": true, "dup": true, "tproxy": true,
	"synproxy": true, "flow": true, "xt": true, "secmark": true, "last": true, "connlimit": true,
}

func (rp *ruleParser) parseStmt() (stmt, error) {
	start := rp.i
	t := rp.peek()
	if t.kind != tWord {
		return nil, errAt(t, "expected a statement, found %s", t.show())
	}
	switch t.text {
	case "accept", "drop", "continue", "return":
		rp.next()
		kinds := map[string]verdictKind{"accept": vAccept, "drop": vDrop, "continue": vContinue, "return": vReturn}
		return &verdictStmt{v: &verdict{kind: kinds[t.text]}}, nil
	case "jump", "goto":
		rp.next()
		v, err := rp.chainVerdict(t)
		if err != nil {
			return nil, err
		}
		return &verdictStmt{v: v}, nil
	case "reject":
		return rp.parseReject()
	case "counter":
		rp.next()
		if rp.isWord(0, "packets") {
			rp.next()
			rp.next()
			if _, err := rp.expectWord("bytes"); err != nil {
				return nil, err
			}
			rp.next()
		} else if rp.isWord(0, "name") {
			rp.next()
			rp.next()
		}
		return &noopStmt{txt: rp.textFrom(start)}, nil
	case "log":
		return rp.parseLog()
	case "comment":
		rp.next()
		if n := rp.next(); n.kind != tString {
			return nil, errAt(n, "expected a comment string, found %s", n.show())
		}
		return &noopStmt{txt: rp.textFrom(start)}, nil
	case "notrack":
		rp.next()
		return &notrackStmt{}, nil
	case "dnat", "snat", "masquerade", "redirect":
		return rp.parseNat()
	case "add", "update", "delete":
		if n := rp.peekAt(1); n.kind == tWord && strings.HasPrefix(n.text, "@") {
			return rp.parseSetUpdate()
		}
		return nil, errAt(t, "expected @set after %q", t.text)
	case "meta":
		if (rp.isWord(1, "mark") || rp.isWord(1, "nftrace")) && rp.isWord(2, "set") {
			rp.next()
			return rp.parseMetaSet(start)
		}
	case "mark", "nftrace":
		if rp.isWord(1, "set") {
			return rp.parseMetaSet(start)
		}
	case "ct":
		if rp.isWord(1, "mark") && rp.isWord(2, "set") {
			rp.next()
			rp.next()
			rp.next()
			val, err := rp.parseValue(fieldTypes{nftdata.Mark})
			if err != nil {
				return nil, err
			}
			return &setMetaStmt{target: "ctmark", val: val, txt: rp.textFrom(start)}, nil
		}
	}
	if unsupportedStmts[t.text] {
		return nil, errAt(t, "unsupported statement %q", t.text)
	}
	return rp.parseExprStmt()
}

// chainVerdict reads the chain name after jump/goto.
func (rp *ruleParser) chainVerdict(kw token) (*verdict, error) {
	n := rp.next()
	if n.kind != tWord && n.kind != tString {
		return nil, errAt(n, "expected a chain name after %s, found %s", kw.text, n.show())
	}
	v := &verdict{kind: vJump, chainName: n.text, tok: n}
	if kw.text == "goto" {
		v.kind = vGoto
	}
	rp.p.addRef(v, rp.tab, rp.context(n))
	return v, nil
}

// context is a CompileError template for a later error at tok in this rule.
func (rp *ruleParser) context(tok token) CompileError {
	ce := rp.wrap(errAt(tok, "")).(*CompileError)
	return *ce
}

// addElem stores an element in s and queues the resolution of a new verdict's chain.
func (p *parser) addElem(s *setDef, tab *table, e elemSpec) {
	if v := s.addElem(e); v != nil && (v.kind == vJump || v.kind == vGoto) {
		p.addRef(v, tab, e.refCtx)
	}
}

func (p *parser) addRef(v *verdict, tab *table, ctx CompileError) {
	p.refs = append(p.refs, chainRef{v: v, table: tab, ctx: ctx})
}

func (rp *ruleParser) parseReject() (stmt, error) {
	rp.next()
	v := verdict{kind: vReject}
	if rp.isWord(0, "with") {
		rp.next()
		k := rp.next()
		switch {
		case k.kind == tWord && k.text == "tcp":
			if _, err := rp.expectWord("reset"); err != nil {
				return nil, err
			}
			v.reject = "tcp reset"
		case k.kind == tWord && (k.text == "icmp" || k.text == "icmpv6" || k.text == "icmp6" || k.text == "icmpx"):
			if rp.isWord(0, "type") {
				rp.next()
			}
			ty := rp.next()
			if ty.kind != tWord {
				return nil, errAt(ty, "expected an icmp type, found %s", ty.show())
			}
			v.reject = k.text + " " + ty.text
		default:
			return nil, errAt(k, "unsupported reject type %s", k.show())
		}
	}
	return &verdictStmt{v: &v}, nil
}

func (rp *ruleParser) parseLog() (stmt, error) {
	start := rp.i
	rp.next()
	for !rp.atEnd() {
		t := rp.peek()
		if t.kind != tWord {
			break
		}
		switch t.text {
		case "prefix":
			rp.next()
			if n := rp.next(); n.kind != tString && n.kind != tWord {
				return nil, errAt(n, "expected a log prefix, found %s", n.show())
			}
		case "level", "group", "snaplen", "queue-threshold":
			rp.next()
			rp.next()
		case "flags":
			rp.next()
			rp.next()
			for rp.peek().kind == tComma {
				rp.next()
				rp.next()
			}
		default:
			return &noopStmt{txt: rp.textFrom(start)}, nil
		}
	}
	return &noopStmt{txt: rp.textFrom(start)}, nil
}

func (rp *ruleParser) parseMetaSet(start int) (stmt, error) {
	key := rp.next() // mark / nftrace
	rp.next()        // set
	if key.text == "nftrace" {
		v := rp.next()
		if v.kind != tWord || (v.text != "1" && v.text != "0") {
			return nil, errAt(v, "expected 0 or 1, found %s", v.show())
		}
		return &noopStmt{txt: rp.textFrom(start), nftrace: v.text == "1"}, nil
	}
	val, err := rp.parseValue(fieldTypes{nftdata.Mark})
	if err != nil {
		return nil, err
	}
	return &setMetaStmt{target: "mark", val: val, txt: rp.textFrom(start)}, nil
}

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
	"ct": true, "numgen": true, "fib": true, "mark": true, "iif": true, "iifname": true,
	"oif": true, "oifname": true, "l4proto": true, "nfproto": true,
}

func isExprKeyword(s string) bool { return exprKeywords[s] }

var unsupportedExprs = map[string]bool{
	"jhash": true, "symhash": true, "icmp": true, "icmpv6": true, "ether": true, "vlan": true,
	"arp": true, "rt": true, "osf": true, "socket": true, "exthdr": true, "ipsec": true,
	"udplite": true, "dccp": true, "ah": true, "esp": true, "comp": true, "hbh": true,
	"frag": true, "dst": true, "mh": true, "srh": true, "igmp": true, "gre": true,
	"vxlan": true, "geneve": true, "gretap": true, "cgroupv2": true,
	"skuid": true, "skgid": true, "pkttype": true, "cpu": true, "iiftype": true, "oiftype": true,
	"iifgroup": true, "oifgroup": true, "rtclassid": true, "cgroup": true, "length": true,
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
		f, err := field("saddr", "daddr", "protocol")
		if err != nil {
			return nil, err
		}
		if rp.tab != nil && rp.tab.family == "ip6" {
			return nil, errAt(t, "ip %s in an ip6 table", f.text)
		}
		return &ipField{fam: packet.IPv4, field: f.text}, nil
	case "ip6":
		f, err := field("saddr", "daddr", "nexthdr")
		if err != nil {
			return nil, err
		}
		if rp.tab != nil && rp.tab.family == "ip" {
			return nil, errAt(t, "ip6 %s in an ip table", f.text)
		}
		return &ipField{fam: packet.IPv6, field: f.text}, nil
	case "tcp", "udp", "sctp", "th":
		f, err := field("sport", "dport")
		if err != nil {
			return nil, err
		}
		// th is any transport header; the others name their protocol.
		n, ok := nftdata.ProtocolNumber(t.text)
		if ok {
			// A transport header field implies "meta l4proto P".
			rp.l4proto, rp.l4known = n, true
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
	case "mark", "iif", "iifname", "oif", "oifname", "l4proto", "nfproto":
		return &metaExpr{key: t.text}, nil
	case "ct":
		return rp.parseCT(t)
	case "numgen":
		return rp.parseNumgen()
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
	if r.kind != tWord || r.text != "type" {
		if r.kind == tWord && (r.text == "oif" || r.text == "oifname") {
			return nil, errAt(r, "fib %s lookups are not supported (only type)", r.text)
		}
		return nil, errAt(r, "expected \"type\" in fib expression, found %s", r.show())
	}
	return e, nil
}

// parseExprStmt reads "EXPR [op] VALUE", "EXPR vmap MAP".
func (rp *ruleParser) parseExprStmt() (stmt, error) {
	start := rp.i
	lhs, err := rp.parseExpr()
	if err != nil {
		return nil, err
	}
	n := rp.peek()
	if n.kind == tWord {
		switch n.text {
		case "vmap":
			rp.next()
			s, err := rp.parseMapRef(n, lhs, nil, true)
			if err != nil {
				return nil, err
			}
			return &vmapStmt{key: lhs, set: s, txt: rp.textFrom(start)}, nil
		case "set":
			return nil, errAt(n, "cannot set %s", lhs)
		case "map":
			return nil, errAt(n, "a map lookup needs a statement that uses its value")
		}
	}
	op := opImplicit
	if n.kind == tOp {
		switch n.text {
		case "==":
			op = opEq
		case "!=":
			op = opNeq
		case "<":
			op = opLt
		case ">":
			op = opGt
		case "<=":
			op = opLe
		case ">=":
			op = opGe
		default:
			return nil, errAt(n, "unexpected operator %q", n.text)
		}
		rp.next()
	}
	ft := lhs.typ()
	r := rp.peek()
	if rp.atEnd() {
		return nil, errAt(r, "%s: missing value to compare with", lhs)
	}
	m := &matchStmt{lhs: lhs, op: op}
	switch {
	case r.kind == tWord && strings.HasPrefix(r.text, "@"):
		rp.next()
		s, err := rp.namedSet(r)
		if err != nil {
			return nil, err
		}
		if !ft.compatible(s.key) {
			return nil, errAt(r, "datatype mismatch: %s has key %s, expression has %s", r.text, s.key, ft)
		}
		m.set = s
	case r.kind == tLBrace:
		s := &setDef{table: rp.tab, key: ft, interval: true}
		if err := rp.parseAnonElements(s); err != nil {
			return nil, err
		}
		m.set = s
	case len(ft) > 1:
		// A concatenated constant: a one-element anonymous set.
		var ctoks []token
		for j := 0; j < 2*len(ft)-1; j++ {
			ctoks = append(ctoks, rp.next())
		}
		s := &setDef{table: rp.tab, key: ft, interval: true}
		ep := &elemParser{p: rp.p, tab: rp.tab, set: s, toks: ctoks, rp: rp}
		e, err := ep.parse()
		if err != nil {
			return nil, err
		}
		rp.p.addElem(s, rp.tab, e)
		s.build()
		m.set = s
	default:
		if ft[0].Kind() == nftdata.KindVerdict {
			return nil, errAt(r, "cannot compare a verdict")
		}
		vt := rp.next()
		lo, hi, err := parseConst(ft[0], vt)
		if err != nil {
			return nil, err
		}
		if ft[0].Bitmask() {
			for rp.peek().kind == tComma {
				rp.next()
				nt := rp.next()
				l2, _, err := parseConst(ft[0], nt)
				if err != nil {
					return nil, err
				}
				for i := range lo {
					lo[i] |= l2[i]
				}
				hi = lo
			}
			m.bits = op == opImplicit
		}
		m.lo, m.hi = lo, hi
	}
	if (op == opImplicit || op == opEq) && m.set == nil && !m.bits && string(m.lo) == string(m.hi) && len(m.lo) == 1 && setsL4(lhs) {
		rp.l4proto, rp.l4known = m.lo[0], true
	}
	if m.set != nil && op != opImplicit && op != opEq && op != opNeq {
		return nil, errAt(n, "operator %s cannot be used with a set", n.text)
	}
	if m.set != nil && op == opEq && m.set.name == "" {
		// "== { ... }" behaves like the implicit form.
		m.op = opImplicit
	}
	m.txt = rp.textFrom(start)
	return m, nil
}

// setsL4 reports whether matching e with a single protocol establishes the rule's
// transport protocol: meta l4proto, ip protocol, ip6 nexthdr, ct protocol.
func setsL4(e expr) bool {
	switch e := e.(type) {
	case *metaExpr:
		return e.key == "l4proto"
	case *ipField:
		return e.field == "protocol" || e.field == "nexthdr"
	case *ctExpr:
		return e.key == "protocol"
	}
	return false
}

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
		if string(lo) != string(hi) {
			return nil, errAt(pt, "port ranges are not supported")
		}
		s.port = &constExpr{val: lo, types: fieldTypes{nftdata.InetService}}
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
		v, err := nftdata.InetService.Parse(portText)
		if err != nil {
			return errAt(t, "bad port %q (port ranges are not supported)", portText)
		}
		s.port = &constExpr{val: v, types: fieldTypes{nftdata.InetService}}
	}
	return nil
}

func (s *natStmt) kindName() string {
	return [...]string{"dnat", "snat", "masquerade", "redirect"}[s.kind]
}

// parseSetUpdate reads "add|update|delete @set { KEY [timeout T] }" and, for a map,
// "add|update|delete @map { KEY [timeout T] : DATA }". The kernel refuses a map
// update without data (even a delete), and verdict maps cannot be updated from the
// packet path at all.
func (rp *ruleParser) parseSetUpdate() (stmt, error) {
	start := rp.i
	op := rp.next()
	st := rp.next()
	s, err := rp.namedSet(st)
	if err != nil {
		return nil, err
	}
	if s.isMap && len(s.data) == 1 && s.data[0] == nftdata.VerdictType {
		return nil, errAt(st, "%s is a verdict map; verdict maps cannot be updated from the packet path", st.text)
	}
	if o := rp.next(); o.kind != tLBrace {
		return nil, errAt(o, `expected "{", found %s`, o.show())
	}
	key, err := rp.parseExpr()
	if err != nil {
		return nil, err
	}
	if !key.typ().compatible(s.key) {
		return nil, errAt(st, "datatype mismatch: %s has key %s, expression has %s", st.text, s.key, key.typ())
	}
	u := &setUpdateStmt{op: op.text, set: s, key: key}
	for {
		t := rp.next()
		if t.kind == tRBrace {
			if s.isMap && u.data == nil {
				return nil, errAt(t, `%s is a map: %s needs ": DATA" after the key (data is %s)`, st.text, op.text, s.data)
			}
			break
		}
		switch {
		case t.kind == tWord && t.text == "timeout" && u.data == nil:
			dt := rp.next()
			d, ok := parseDuration(dt.text)
			if !ok {
				return nil, errAt(dt, "bad duration %s", dt.show())
			}
			u.timeout = d
		case t.kind == tWord && t.text == "counter" && u.data == nil:
		case t.kind == tColon && u.data == nil:
			if !s.isMap {
				return nil, errAt(t, "%s is a set; its elements have no data (use a map)", st.text)
			}
			if u.data, err = rp.parseMapData(s, st); err != nil {
				return nil, err
			}
		default:
			return nil, errAt(t, `expected "}", found %s`, t.show())
		}
	}
	u.txt = rp.textFrom(start)
	return u, nil
}

// parseMapData reads the DATA of "update @map { KEY : DATA }", an expression or a
// constant, and checks it against the map's data type, field by field.
func (rp *ruleParser) parseMapData(s *setDef, st token) (expr, error) {
	t := rp.peek()
	if t.kind == tRBrace || t.kind == tEOF {
		return nil, errAt(t, "expected the map data (%s), found %s", s.data, t.show())
	}
	if !(t.kind == tWord && isExprKeyword(t.text)) {
		return rp.parseConstExpr(s.data)
	}
	start := rp.i
	e, err := rp.parseExpr()
	if err != nil {
		return nil, err
	}
	if rp.isWord(0, "map") {
		if e, err = rp.parseMapExpr(e, start, s.data); err != nil {
			return nil, err
		}
	}
	if !e.typ().compatible(s.data) {
		return nil, errAt(t, "datatype mismatch: %s has data %s, expression has %s", st.text, s.data, e.typ())
	}
	return e, nil
}

// elemParser reads one set or map element: KEY [. KEY]* [options] [: DATA].
type elemParser struct {
	p    *parser
	tab  *table
	set  *setDef
	toks []token
	i    int
	rp   *ruleParser // when inside a rule, for error context
}

func (ep *elemParser) next() token {
	if ep.i >= len(ep.toks) {
		last := ep.toks[len(ep.toks)-1]
		return token{kind: tEOF, text: "end of element", off: last.end + 1, line: last.line, col: last.col + last.end - last.off + 1}
	}
	t := ep.toks[ep.i]
	ep.i++
	return t
}

func (ep *elemParser) fail(err *posError) error {
	if ep.rp != nil {
		return err
	}
	return &CompileError{Rule: -1, Line: err.tok.line, Column: err.tok.col, Msg: err.msg}
}

func (ep *elemParser) parse() (elemSpec, error) {
	var e elemSpec
	s := ep.set
	for f, ty := range s.key {
		if f > 0 {
			d := ep.next()
			if d.kind != tWord || d.text != "." {
				return e, ep.fail(errAt(d, "expected \".\" and %d more key fields (key is %s), found %s", len(s.key)-f, s.key, d.show()))
			}
		}
		t := ep.next()
		lo, hi, err := parseConst(ty, t)
		if err != nil {
			var pe *posError
			if errors.As(err, &pe) {
				return e, ep.fail(pe)
			}
			return e, err
		}
		if string(lo) != string(hi) && !s.interval {
			return e, ep.fail(errAt(t, "%s needs \"flags interval\" for the range %q", s.displayName(), t.text))
		}
		e.lo = append(e.lo, lo...)
		e.hi = append(e.hi, hi...)
	}
	for ep.i < len(ep.toks) {
		t := ep.next()
		if t.kind == tColon {
			break
		}
		if t.kind != tWord {
			return e, ep.fail(errAt(t, "unexpected %s in element", t.show()))
		}
		switch t.text {
		case "timeout", "expires":
			dt := ep.next()
			d, ok := parseDuration(dt.text)
			if !ok {
				return e, ep.fail(errAt(dt, "bad duration %s", dt.show()))
			}
			if t.text == "timeout" {
				e.timeout = d
			} else {
				e.expires = d
			}
		case "comment":
			ct := ep.next()
			if ct.kind != tString {
				return e, ep.fail(errAt(ct, "expected a comment string, found %s", ct.show()))
			}
			e.comment = ct.text
		case "counter":
			if ep.i < len(ep.toks) && ep.toks[ep.i].text == "packets" {
				ep.i += 4
			}
		case ".":
			return e, ep.fail(errAt(t, "too many key fields (key is %s)", s.key))
		default:
			return e, ep.fail(errAt(t, "unexpected %s in element", t.show()))
		}
		if ep.i > len(ep.toks) {
			ep.i = len(ep.toks)
		}
	}
	if !s.isMap {
		if ep.i > 0 && ep.toks[ep.i-1].kind == tColon {
			return e, ep.fail(errAt(ep.toks[ep.i-1], "set elements have no data (use a map)"))
		}
		return e, nil
	}
	if ep.i == 0 || ep.toks[ep.i-1].kind != tColon {
		return e, ep.fail(errAt(ep.next(), "map element needs \": DATA\""))
	}
	if len(s.data) == 1 && s.data[0] == nftdata.VerdictType {
		t := ep.next()
		kinds := map[string]verdictKind{"accept": vAccept, "drop": vDrop, "continue": vContinue, "return": vReturn}
		switch {
		case t.kind == tWord && (t.text == "jump" || t.text == "goto"):
			n := ep.next()
			if n.kind != tWord && n.kind != tString {
				return e, ep.fail(errAt(n, "expected a chain name, found %s", n.show()))
			}
			v := &verdict{kind: vJump, chainName: n.text, tok: n}
			if t.text == "goto" {
				v.kind = vGoto
			}
			if ep.rp != nil {
				e.refCtx = ep.rp.context(n)
			} else {
				e.refCtx = CompileError{Rule: -1, Line: n.line, Column: n.col, Table: ep.tab.id(), Set: s.name}
			}
			e.verdict = v
		case t.kind == tWord && kinds[t.text] != 0 || t.text == "continue":
			e.verdict = &verdict{kind: kinds[t.text]}
		default:
			return e, ep.fail(errAt(t, "expected a verdict, found %s", t.show()))
		}
	} else {
		for f, ty := range s.data {
			if f > 0 {
				d := ep.next()
				if d.kind != tWord || d.text != "." {
					return e, ep.fail(errAt(d, "expected \".\" in map data (data is %s), found %s", s.data, d.show()))
				}
			}
			t := ep.next()
			lo, hi, err := parseConst(ty, t)
			if err != nil {
				var pe *posError
				if errors.As(err, &pe) {
					return e, ep.fail(pe)
				}
				return e, err
			}
			if string(lo) != string(hi) {
				return e, ep.fail(errAt(t, "ranges in map data are not supported"))
			}
			e.data = append(e.data, lo...)
		}
	}
	if ep.i < len(ep.toks) {
		t := ep.next()
		return e, ep.fail(errAt(t, "unexpected %s after element", t.show()))
	}
	return e, nil
}
