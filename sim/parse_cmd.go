package sim

import (
	"strconv"
)

// parseAdd reads `add|create|insert OBJECT ...` (the verb consumed).
func (p *parser) parseAdd(verb token, insert bool) error {
	ot, err := p.expect(tWord, "an object type")
	if err != nil {
		return err
	}
	if insert && ot.text != "rule" {
		return p.errTok(ot, "insert only applies to rules")
	}
	switch ot.text {
	case "table":
		tab, _, err := p.openTable(true)
		if err != nil {
			return err
		}
		if p.lx.peek().kind == tLBrace {
			p.lx.next()
			if err := p.parseTableBody(tab); err != nil {
				return err
			}
		}
		return p.endOfStatement()
	case "chain":
		tab, c, err := p.openChain(true)
		if err != nil {
			return err
		}
		if p.lx.peek().kind == tLBrace {
			p.lx.next()
			if err := p.parseChainBody(c); err != nil {
				return inChain(err, tab, c)
			}
		}
		return p.endOfStatement()
	case "rule":
		return p.parseAddRule(insert)
	case "set", "map":
		tab, nameTok, err := p.tableAndName(ot.text)
		if err != nil {
			return err
		}
		if _, err := p.expect(tLBrace, `"{"`); err != nil {
			return err
		}
		if err := p.parseSetBody(tab, nameTok, ot.text == "map"); err != nil {
			return err
		}
		return p.endOfStatement()
	case "element":
		tab, s, err := p.elementTarget()
		if err != nil {
			return err
		}
		if err := p.parseElements(tab, s, false); err != nil {
			return withSet(err, tab, s)
		}
		return p.endOfStatement()
	case "counter":
		if _, _, err := p.tableAndName("counter"); err != nil {
			return err
		}
		if p.lx.peek().kind == tLBrace {
			p.lx.next()
			for {
				t, err := p.next()
				if err != nil {
					return err
				}
				if t.kind == tRBrace {
					break
				}
				if t.kind == tEOF {
					return p.errTok(t, `expected "}"`)
				}
			}
		}
		return p.endOfStatement()
	}
	return p.errTok(ot, "unsupported object %q", ot.text)
}

// parseAddRule reads the rest of "add rule" (or "insert rule" when insert):
// `[family] table chain [index N] rule`.
func (p *parser) parseAddRule(insert bool) error {
	_, c, err := p.openChain(false)
	if err != nil {
		return err
	}
	pos := -1
	if insert {
		pos = 0
	}
	if t := p.lx.peek(); t.kind == tWord && (t.text == "index" || t.text == "handle" || t.text == "position") {
		p.lx.next()
		if t.text != "index" {
			return p.errTok(t, "rule positions by %s are not supported (use index)", t.text)
		}
		nt, err := p.expect(tWord, "an index")
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(nt.text)
		if err != nil || n < 0 || n >= len(c.rules) {
			return p.errTok(nt, "chain %s has no rule index %q", c.name, nt.text)
		}
		pos = n
		if !insert {
			pos = n + 1
		}
	}
	toks, err := p.collectRule()
	if err != nil {
		return err
	}
	if len(toks) == 0 {
		return p.errTok(p.lx.peek(), "empty rule")
	}
	if err := p.addRule(c, toks, pos); err != nil {
		return err
	}
	return p.endOfStatement()
}

func (p *parser) parseFlush() error {
	ot, err := p.expect(tWord, "an object type")
	if err != nil {
		return err
	}
	switch ot.text {
	case "ruleset":
		p.tables = map[string]*table{}
		p.tableL = nil
		p.refs = nil
	case "table":
		tab, _, err := p.openTable(false)
		if err != nil {
			return err
		}
		for _, c := range tab.chainL {
			c.rules = nil
		}
		for _, s := range tab.setL {
			s.flush()
		}
	case "chain":
		_, c, err := p.openChain(false)
		if err != nil {
			return err
		}
		c.rules = nil
	case "set", "map":
		tab, nt, err := p.tableAndName(ot.text)
		if err != nil {
			return err
		}
		s, ok := tab.sets[nt.text]
		if !ok {
			return p.errTok(nt, "table %s: no such %s %q", tab.id(), ot.text, nt.text)
		}
		s.flush()
	default:
		return p.errTok(ot, "unsupported flush of %q", ot.text)
	}
	return p.endOfStatement()
}

func (p *parser) parseDelete(destroy bool) error {
	ot, err := p.expect(tWord, "an object type")
	if err != nil {
		return err
	}
	switch ot.text {
	case "table":
		fam, _ := p.family()
		nt, err := p.name("table")
		if err != nil {
			return err
		}
		key := fam + " " + nt.text
		tab, ok := p.tables[key]
		if !ok {
			if destroy {
				return p.endOfStatement()
			}
			return p.errTok(nt, "no such table %s", key)
		}
		delete(p.tables, key)
		for i, t := range p.tableL {
			if t == tab {
				p.tableL = append(p.tableL[:i:i], p.tableL[i+1:]...)
				break
			}
		}
	case "chain", "set", "map":
		fam, _ := p.family()
		tt, err := p.name("table")
		if err != nil {
			return err
		}
		tab, ok := p.tables[fam+" "+tt.text]
		nt, err := p.name(ot.text)
		if err != nil {
			return err
		}
		if !ok {
			if destroy {
				return p.endOfStatement()
			}
			return p.errTok(tt, "no such table %s %s", fam, tt.text)
		}
		if ot.text == "chain" {
			c, ok := tab.chains[nt.text]
			if !ok {
				if destroy {
					return p.endOfStatement()
				}
				return p.errTok(nt, "table %s: no such chain %q", tab.id(), nt.text)
			}
			delete(tab.chains, nt.text)
			for i, x := range tab.chainL {
				if x == c {
					tab.chainL = append(tab.chainL[:i:i], tab.chainL[i+1:]...)
					break
				}
			}
		} else {
			s, ok := tab.sets[nt.text]
			if !ok {
				if destroy {
					return p.endOfStatement()
				}
				return p.errTok(nt, "table %s: no such %s %q", tab.id(), ot.text, nt.text)
			}
			delete(tab.sets, nt.text)
			s.deleted = true
			for i, x := range tab.setL {
				if x == s {
					tab.setL = append(tab.setL[:i:i], tab.setL[i+1:]...)
					break
				}
			}
		}
	case "element":
		tab, s, err := p.elementTarget()
		if err != nil {
			return err
		}
		if destroy {
			// destroy ignores missing elements: parse, then delete what exists.
			tmp := &setDef{name: s.name, table: tab, key: s.key, data: s.data, isMap: s.isMap, interval: true}
			if err := p.parseElements(tab, tmp, false); err != nil {
				return withSet(err, tab, s)
			}
			for i := range tmp.elems {
				s.deleteElem(tmp.lo(&tmp.elems[i]), tmp.hi(&tmp.elems[i]))
			}
		} else if err := p.parseElements(tab, s, true); err != nil {
			return withSet(err, tab, s)
		}
	case "rule":
		return p.errTok(ot, "deleting rules by handle is not supported")
	default:
		return p.errTok(ot, "unsupported delete of %q", ot.text)
	}
	return p.endOfStatement()
}
