package sim

import (
	"strings"

	"github.com/nftproxy/nftproxy/nftdata"
)

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
			return rp.parseFieldSet(start, lhs, n)
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
		case "!":
			if !isBitmaskExpr(lhs) {
				return nil, errAt(n, "%s: \"!\" needs a bitmask expression (tcp flags)", lhs)
			}
			op = opNone
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
	if me, ok := lhs.(*metaExpr); ok && (me.key == "skuid" || me.key == "skgid") {
		m.und = me
	}
	syms := symbolsOf(lhs)
	if fe, ok := lhs.(*fibExpr); ok && fe.result == "oif" && rp.isWord(0, "0") && (op == opImplicit || op == opEq || op == opNeq) {
		// "oif 0" (iptables-nft's rpfilter) is interface index 0: "oif missing".
		rp.toks[rp.i].text = "missing"
	}
	if fe, ok := lhs.(*fibExpr); ok && fe.result != "type" && (rp.isWord(0, "missing") || rp.isWord(0, "exists")) && (op == opImplicit || op == opEq || op == opNeq) {
		// "oif missing": the lookup found no interface (the result is zero).
		missing := rp.next().text == "missing"
		if op == opNeq {
			missing = !missing
		}
		m.op = opEq
		if !missing {
			m.op = opNeq
		}
		m.lo = make([]byte, ft.width())
		m.hi = m.lo
		m.txt = rp.textFrom(start)
		return m, nil
	}
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
		s := &setDef{table: rp.tab, key: ft, interval: true, syms: syms}
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
		s := &setDef{table: rp.tab, key: ft, interval: true, syms: syms}
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
		if syms != nil && syms[0] != nil {
			if err := rp.parseSymMatch(m, syms[0], vt); err != nil {
				return nil, err
			}
			break
		}
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

// parseSymMatch reads the value of a match on an expression with symbolic constants:
// a name, number or range; for a bitmask (tcp flags) a list of flags ("syn,ack",
// "syn|ack"), which the implicit match reads as "any of", and an optional mask
// ("syn / fin,syn,rst,ack": the flags under the mask are exactly syn).
func (rp *ruleParser) parseSymMatch(m *matchStmt, syms symbols, vt token) error {
	ft := m.lhs.typ()
	if !isBitmaskExpr(m.lhs) {
		lo, hi, err := parseSymConst(ft[0], syms, vt)
		if err != nil {
			return err
		}
		m.lo, m.hi = lo, hi
		return nil
	}
	v, err := rp.parseSymBits(ft[0], syms, vt, true)
	if err != nil {
		return err
	}
	m.lo, m.hi = v, v
	if m.op == opNone {
		// "tcp flags ! fin,syn": none of these flags is set.
		m.lhs = &binopExpr{op: "&", x: m.lhs, arg: v, txt: vt.text}
		m.op = opEq
		m.lo = make([]byte, len(v))
		m.hi = m.lo
		return nil
	}
	if !rp.isWord(0, "/") {
		m.bits = m.op == opImplicit
		return nil
	}
	slash := rp.next()
	maskStart := rp.i
	mask, err := rp.parseSymBits(ft[0], syms, rp.next(), true)
	if err != nil {
		return err
	}
	if _, ok := m.lhs.(*binopExpr); ok {
		return errAt(slash, "a mask after a masked expression")
	}
	m.lhs = &binopExpr{op: "&", x: m.lhs, arg: mask, txt: rp.textFrom(maskStart)}
	return nil
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
	if err := rp.parseElemRest(u, st); err != nil {
		return nil, err
	}
	u.txt = rp.textFrom(start)
	return u, nil
}

// parseElemRest reads what follows the key of "add|update @set { KEY ... }" up to
// "}": a timeout, the data of a map element, a counter, and a limit, quota or ct
// count, whose outcome for the element the packet cannot decide (a fork).
func (rp *ruleParser) parseElemRest(u *setUpdateStmt, st token) error {
	s := u.set
	for {
		t := rp.next()
		if t.kind == tRBrace {
			if s.isMap && u.data == nil {
				return errAt(t, `%s is a map: %s needs ": DATA" after the key (data is %s)`, st.text, u.op, s.data)
			}
			return nil
		}
		switch {
		case t.kind == tWord && t.text == "timeout" && u.data == nil:
			dt := rp.next()
			d, ok := parseDuration(dt.text)
			if !ok {
				return errAt(dt, "bad duration %s", dt.show())
			}
			u.timeout = d
		case t.kind == tWord && t.text == "counter" && u.data == nil:
			if rp.isWord(0, "packets") {
				for range 4 {
					rp.next() // packets N bytes N
				}
			}
		case t.kind == tWord && (t.text == "limit" || t.text == "quota" || t.text == "ct") && u.stateful == nil:
			rp.i--
			f, err := rp.parseForkStmt()
			if err != nil {
				return err
			}
			fs, ok := f.(*forkStmt)
			if !ok {
				return errAt(t, "unsupported %s in a set element", t.text)
			}
			for i := range fs.outcomes {
				fs.outcomes[i] += " for its element of " + st.text
			}
			u.stateful = fs
		case t.kind == tColon && u.data == nil:
			if !s.isMap {
				return errAt(t, "%s is a set; its elements have no data (use a map)", st.text)
			}
			d, err := rp.parseMapData(s, st)
			if err != nil {
				return err
			}
			u.data = d
		default:
			return errAt(t, `expected "}", found %s`, t.show())
		}
	}
}

// parseMeter reads "meter NAME [size N] { KEY [timeout T] STMT }": an update of the
// dynamic set NAME, which nft list ruleset does not list, made here on first use.
func (rp *ruleParser) parseMeter() (stmt, error) {
	start := rp.i
	rp.next()
	name := rp.next()
	if name.kind != tWord && name.kind != tString {
		return nil, errAt(name, "expected the meter's name, found %s", name.show())
	}
	if rp.isWord(0, "size") {
		rp.next()
		rp.next()
	}
	if o := rp.next(); o.kind != tLBrace {
		return nil, errAt(o, `expected "{", found %s`, o.show())
	}
	key, err := rp.parseExpr()
	if err != nil {
		return nil, err
	}
	s, ok := rp.tab.sets[name.text]
	if !ok {
		s = &setDef{name: name.text, table: rp.tab, key: key.typ()}
		rp.tab.sets[s.name] = s
		rp.tab.setL = append(rp.tab.setL, s)
	}
	if !key.typ().compatible(s.key) {
		return nil, errAt(name, "datatype mismatch: %s has key %s, expression has %s", name.text, s.key, key.typ())
	}
	u := &setUpdateStmt{op: "update", set: s, key: key}
	if err := rp.parseElemRest(u, name); err != nil {
		return nil, err
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

// parseFieldSet reads "FIELD set VALUE" (n is "set"): ip dscp, ttl and hoplimit, and
// the address and port fields (stateless NAT).
func (rp *ruleParser) parseFieldSet(start int, lhs expr, n token) (stmt, error) {
	if h, ok := lhs.(*ipHdrField); ok && (h.field == "dscp" || h.field == "ttl" || h.field == "hoplimit") {
		rp.next()
		syms, _ := h.symbols()
		vt := rp.next()
		lo, hi, err := parseSymConst(nftdata.Integer8, syms, vt)
		if err != nil {
			return nil, err
		}
		if string(lo) != string(hi) {
			return nil, errAt(vt, "a range is not allowed here")
		}
		return &hdrSetStmt{f: h, val: lo[0], txt: rp.textFrom(start)}, nil
	}
	if f, ok := lhs.(*ipField); ok && (f.field == "saddr" || f.field == "daddr") {
		rp.next()
		return rp.parsePayloadSet(start, lhs)
	}
	if _, ok := lhs.(*thField); ok {
		rp.next()
		return rp.parsePayloadSet(start, lhs)
	}
	return nil, errAt(n, "cannot set %s", lhs)
}
