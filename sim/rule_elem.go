package sim

import (
	"errors"

	"github.com/nftproxy/nftproxy/nftdata"
)

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
		var sym symbols
		if f < len(s.syms) {
			sym = s.syms[f]
		}
		lo, hi, err := parseSymConst(ty, sym, t)
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
