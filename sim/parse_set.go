package sim

import (
	"errors"

	"github.com/nftproxy/nftproxy/nftdata"
)

// parseSetBody reads a set or map body after "{" up to and including "}".
func (p *parser) parseSetBody(tab *table, nameTok token, isMap bool) error {
	s, ok := tab.sets[nameTok.text]
	if !ok {
		s = &setDef{name: nameTok.text, table: tab, isMap: isMap}
	} else if s.isMap != isMap {
		return p.errTok(nameTok, "table %s: %s exists with another kind", tab.id(), nameTok.text)
	}
	setErr := func(e error) error {
		var ce *CompileError
		if errors.As(e, &ce) {
			ce.Table, ce.Set = tab.id(), s.name
		}
		return e
	}
	for {
		t, err := p.next()
		if err != nil {
			return setErr(err)
		}
		switch t.kind {
		case tRBrace:
			if s.key == nil {
				return setErr(p.errTok(t, "%s has no type", nameTok.text))
			}
			if !ok {
				tab.sets[s.name] = s
				tab.setL = append(tab.setL, s)
			}
			return nil
		case tNL, tSemi:
			continue
		case tWord:
		default:
			return setErr(p.errTok(t, "unexpected %s", t.show()))
		}
		switch t.text {
		case "type", "typeof":
			toks, err := p.collectRule()
			if err != nil {
				return setErr(err)
			}
			if err := p.parseSetType(tab, s, t, toks); err != nil {
				return setErr(err)
			}
		case "flags":
			fl, err := p.wordList()
			if err != nil {
				return setErr(err)
			}
			for _, f := range fl {
				switch f {
				case "interval":
					s.interval = true
				case "constant", "dynamic", "timeout":
				default:
					return setErr(p.errTok(t, "unsupported set flag %q", f))
				}
			}
		case "timeout", "gc-interval":
			dt, err := p.expect(tWord, "a duration")
			if err != nil {
				return setErr(err)
			}
			d, ok := parseDuration(dt.text)
			if !ok {
				return setErr(p.errTok(dt, "bad duration %q", dt.text))
			}
			if t.text == "timeout" {
				s.timeout = d
			}
		case "size":
			if _, err := p.expect(tWord, "a size"); err != nil {
				return setErr(err)
			}
		case "policy":
			if _, err := p.expect(tWord, "a set policy"); err != nil {
				return setErr(err)
			}
		case "auto-merge", "counter":
		case "comment":
			ct, err := p.expect(tString, "a comment string")
			if err != nil {
				return setErr(err)
			}
			s.comment = ct.text
		case "elements":
			if ot, err := p.next(); err != nil || ot.kind != tOp || ot.text != "=" {
				if err != nil {
					return setErr(err)
				}
				return setErr(p.errTok(ot, `expected "=", found %s`, ot.show()))
			}
			if _, err := p.expect(tLBrace, `"{"`); err != nil {
				return setErr(err)
			}
			if s.key == nil {
				return setErr(p.errTok(t, "elements before the type"))
			}
			if err := p.parseElements(tab, s, false); err != nil {
				return setErr(err)
			}
		default:
			return setErr(p.errTok(t, "unsupported set property %q", t.text))
		}
		if err := p.endOfStatement(); err != nil {
			return setErr(err)
		}
	}
}

// parseSetType reads the key (and data) type from "type a . b : c" or
// "typeof EXPR . EXPR : EXPR".
func (p *parser) parseSetType(tab *table, s *setDef, kw token, toks []token) error {
	split := len(toks)
	for i, t := range toks {
		if t.kind == tColon {
			split = i
			break
		}
	}
	keyToks := toks[:split]
	var dataToks []token
	if split < len(toks) {
		dataToks = toks[split+1:]
		if !s.isMap {
			return p.errTok(toks[split], "a set has no data type (use a map)")
		}
	} else if s.isMap {
		return p.errTok(kw, "map needs a data type (KEY : DATA)")
	}
	if len(keyToks) == 0 {
		return p.errTok(kw, "missing key type")
	}
	var err error
	if s.key, err = p.typeList(tab, kw, keyToks, false); err != nil {
		return err
	}
	if s.isMap {
		if s.data, err = p.typeList(tab, kw, dataToks, true); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) typeList(tab *table, kw token, toks []token, data bool) (fieldTypes, error) {
	if len(toks) == 0 {
		return nil, p.errTok(kw, "missing type")
	}
	if len(toks) == 1 && toks[0].kind == tWord && toks[0].text == "verdict" {
		if !data {
			return nil, p.errTok(toks[0], "verdict is not a key type")
		}
		return fieldTypes{nftdata.VerdictType}, nil
	}
	if kw.text == "typeof" {
		rp := &ruleParser{p: p, tab: tab, toks: toks}
		e, err := rp.parseExpr()
		if err != nil {
			return nil, rp.wrap(err)
		}
		if rp.i != len(toks) {
			return nil, p.errTok(toks[rp.i], "unexpected %s in typeof", toks[rp.i].show())
		}
		return e.typ(), nil
	}
	var ft fieldTypes
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if i%2 == 1 {
			if t.kind != tWord || t.text != "." {
				return nil, p.errTok(t, `expected "." between types, found %s`, t.show())
			}
			continue
		}
		dt, ok := nftdata.TypeByName(t.text)
		if !ok || t.kind != tWord || dt == nftdata.VerdictType {
			return nil, p.errTok(t, "unsupported data type %q", t.text)
		}
		ft = append(ft, dt)
	}
	if len(toks)%2 == 0 {
		return nil, p.errTok(toks[len(toks)-1], "dangling \".\" in type")
	}
	return ft, nil
}

// parseElements reads elements after "{" up to and including "}", adding them to s
// (or deleting them).
func (p *parser) parseElements(tab *table, s *setDef, del bool) error {
	for {
		var toks []token
		for {
			t, err := p.next()
			if err != nil {
				return err
			}
			switch t.kind {
			case tNL:
				continue
			case tEOF:
				return p.errTok(t, `expected "}", found end of input`)
			case tLBrace:
				return p.errTok(t, `unexpected "{" in element`)
			}
			if t.kind == tComma || t.kind == tRBrace {
				if len(toks) > 0 {
					ep := &elemParser{p: p, tab: tab, set: s, toks: toks}
					e, err := ep.parse()
					if err != nil {
						return err
					}
					if del {
						if !s.deleteElem(e.lo, e.hi) {
							return p.errTok(toks[0], "no such element %s", p.src[toks[0].off:toks[len(toks)-1].end])
						}
					} else {
						p.addElem(s, tab, e)
					}
				} else if t.kind == tComma {
					return p.errTok(t, `unexpected ","`)
				}
				if t.kind == tRBrace {
					return nil
				}
				break
			}
			toks = append(toks, t)
			continue
		}
	}
}

func withSet(err error, tab *table, s *setDef) error {
	var ce *CompileError
	if errors.As(err, &ce) {
		ce.Table, ce.Set = tab.id(), s.name
	}
	return err
}

// elementTarget reads the "TABLE SET {" that starts an element command and returns
// the table and the set or map.
func (p *parser) elementTarget() (*table, *setDef, error) {
	tab, nt, err := p.tableAndName("set")
	if err != nil {
		return nil, nil, err
	}
	s, ok := tab.sets[nt.text]
	if !ok {
		return nil, nil, p.errTok(nt, "table %s: no such set or map %q", tab.id(), nt.text)
	}
	if _, err := p.expect(tLBrace, `"{"`); err != nil {
		return nil, nil, err
	}
	return tab, s, nil
}
