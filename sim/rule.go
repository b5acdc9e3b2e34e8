package sim

import (
	"errors"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/nftdata"
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

var unsupportedStmts = map[string]bool{
	"secmark": true, "last": true, "connlimit": true,
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
	case "tcp":
		if rp.isWord(1, "option") && rp.isWord(2, "maxseg") && rp.isWord(3, "size") && rp.isWord(4, "set") {
			return rp.parseTCPOption()
		}
	case "ct":
		if rp.isWord(1, "helper") && rp.isWord(2, "set") {
			rp.next()
			rp.next()
			rp.next()
			if n := rp.next(); n.kind != tString && n.kind != tWord {
				return nil, errAt(n, "expected a ct helper name, found %s", n.show())
			}
			// The helper only follows the connection's related flows (ftp data,
			// ...), which a single packet's trace does not reach.
			return &noopStmt{txt: rp.textFrom(start)}, nil
		}
		if rp.isWord(1, "zone") && rp.isWord(2, "set") || (rp.isWord(1, "original") || rp.isWord(1, "reply")) && rp.isWord(2, "zone") && rp.isWord(3, "set") {
			return rp.parseCTZoneSet(start)
		}
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
	if parse, ok := socketStmts[t.text]; ok {
		return parse(rp)
	}
	if s, err := rp.parseForkStmt(); s != nil || err != nil {
		return s, err
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

// parseTCPOption reads "tcp option maxseg size set rt mtu|N", which clamps the MSS of
// a SYN. Later rules' "tcp option maxseg size" still read the packet's own MSS: the
// clamp is noted as a statement of the trace, not applied to the packet.
func (rp *ruleParser) parseTCPOption() (stmt, error) {
	start := rp.i
	for range 4 {
		rp.next() // tcp option maxseg size
	}
	rp.next()
	v := rp.next()
	switch {
	case v.kind == tWord && v.text == "rt":
		if _, err := rp.expectWord("mtu"); err != nil {
			return nil, err
		}
	case v.kind == tWord:
		if _, err := strconv.ParseUint(v.text, 0, 16); err != nil {
			return nil, errAt(v, "bad maxseg size %s", v.show())
		}
	default:
		return nil, errAt(v, "expected a maxseg size or rt mtu, found %s", v.show())
	}
	return &noopStmt{txt: rp.textFrom(start)}, nil
}
