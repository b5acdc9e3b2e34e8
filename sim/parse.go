package sim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/nftdata"
)

// parser reads nft syntax: both the command form that knftables.Fake.Dump and
// `nft -f` scripts use ("add table ...", "add rule ...", "add element ...") and the
// nested form of `nft list ruleset` ("table ip t { chain c { ... } }"), and the two
// mixed, building tables as it goes.
type parser struct {
	src    string
	lx     *lexer
	tables map[string]*table
	tableL []*table
	// refs are verdicts naming chains, resolved when all chains are known.
	refs []chainRef
	// setUses are the named sets rules refer to, checked for deletion at the end.
	setUses []setUse
}

// setUse is a rule's reference to a named set.
type setUse struct {
	set *setDef
	ctx CompileError
}

// chainRef is a verdict to resolve, with the context to report if it dangles.
type chainRef struct {
	v     *verdict
	table *table
	ctx   CompileError
}

var families = map[string]bool{"ip": true, "ip6": true, "inet": true, "arp": true, "bridge": true, "netdev": true}

func newParser(src string) *parser {
	return &parser{src: src, lx: newLexer(src), tables: map[string]*table{}}
}

func (p *parser) errTok(t token, format string, args ...any) *CompileError {
	return &CompileError{Rule: -1, Line: t.line, Column: t.col, Msg: fmt.Sprintf(format, args...)}
}

// lexErr returns the lexer's error, if it hit one.
func (p *parser) lexErr() error {
	if p.lx.err != nil {
		p.lx.err.Rule = -1
		return p.lx.err
	}
	return nil
}

func (p *parser) next() (token, error) {
	t := p.lx.next()
	if err := p.lexErr(); err != nil {
		return t, err
	}
	return t, nil
}

func (p *parser) expect(kind tokKind, what string) (token, error) {
	t, err := p.next()
	if err != nil {
		return t, err
	}
	if t.kind != kind {
		return t, p.errTok(t, "expected %s, found %s", what, t.show())
	}
	return t, nil
}

// name reads an object name: a word or a quoted string.
func (p *parser) name(what string) (token, error) {
	t, err := p.next()
	if err != nil {
		return t, err
	}
	if t.kind != tWord && t.kind != tString {
		return t, p.errTok(t, "expected %s name, found %s", what, t.show())
	}
	return t, nil
}

// endOfStatement consumes an optional ";" or newline; "}" and EOF are left in place.
func (p *parser) endOfStatement() error {
	t := p.lx.peek()
	switch t.kind {
	case tSemi, tNL:
		p.lx.next()
		return nil
	case tRBrace, tEOF:
		return nil
	}
	return p.errTok(t, "unexpected %s", t.show())
}

// family reads an optional family name (default ip).
func (p *parser) family() (string, token) {
	t := p.lx.peek()
	if t.kind == tWord && families[t.text] {
		// "table ip" alone is a table named ip in family ip; look one further.
		p.lx.next()
		n := p.lx.peek()
		if n.kind == tWord || n.kind == tString {
			return t.text, t
		}
		p.lx.peeked = append([]token{t}, p.lx.peeked...)
	}
	return "ip", t
}

func (p *parser) getTable(fam string, nameTok token, create bool) (*table, error) {
	key := fam + " " + nameTok.text
	if t, ok := p.tables[key]; ok {
		return t, nil
	}
	if !create {
		return nil, p.errTok(nameTok, "no such table %s", key)
	}
	switch fam {
	case "ip", "ip6", "inet":
	default:
		return nil, p.errTok(nameTok, "table %s: family %s is not supported (only ip, ip6 and inet)", key, fam)
	}
	t := &table{family: fam, name: nameTok.text, chains: map[string]*chain{}, sets: map[string]*setDef{}}
	p.tables[key] = t
	p.tableL = append(p.tableL, t)
	return t, nil
}

func (p *parser) getChain(t *table, nameTok token, create bool) (*chain, error) {
	if c, ok := t.chains[nameTok.text]; ok {
		return c, nil
	}
	if !create {
		return nil, p.errTok(nameTok, "table %s: no such chain %q", t.id(), nameTok.text)
	}
	c := &chain{name: nameTok.text, table: t}
	t.chains[c.name] = c
	t.chainL = append(t.chainL, c)
	return c, nil
}

func (p *parser) parseFile() error {
	for {
		t, err := p.next()
		if err != nil {
			return err
		}
		switch t.kind {
		case tEOF:
			return nil
		case tNL, tSemi:
			continue
		case tWord:
		default:
			return p.errTok(t, "expected a command, found %s", t.show())
		}
		switch t.text {
		case "table":
			err = p.parseTableBlock()
		case "add", "create":
			err = p.parseAdd(t, false)
		case "insert":
			err = p.parseAdd(t, true)
		case "flush":
			err = p.parseFlush()
		case "delete", "destroy":
			err = p.parseDelete(t.text == "destroy")
		default:
			return p.errTok(t, "unsupported command %q", t.text)
		}
		if err != nil {
			return err
		}
	}
}

// parseTableBlock reads `table [family] name { ... }` (the "table" keyword consumed).
func (p *parser) parseTableBlock() error {
	fam, _ := p.family()
	nameTok, err := p.name("table")
	if err != nil {
		return err
	}
	tab, err := p.getTable(fam, nameTok, true)
	if err != nil {
		return err
	}
	if _, err := p.expect(tLBrace, `"{"`); err != nil {
		return err
	}
	return p.parseTableBody(tab)
}

func (p *parser) parseTableBody(tab *table) error {
	for {
		t, err := p.next()
		if err != nil {
			return err
		}
		switch t.kind {
		case tRBrace:
			return nil
		case tNL, tSemi:
			continue
		case tWord:
		default:
			return p.errTok(t, "table %s: expected chain, set or map, found %s", tab.id(), t.show())
		}
		switch t.text {
		case "chain":
			nameTok, err := p.name("chain")
			if err != nil {
				return err
			}
			c, err := p.getChain(tab, nameTok, true)
			if err != nil {
				return err
			}
			if _, err := p.expect(tLBrace, `"{"`); err != nil {
				return err
			}
			if err := p.parseChainBody(c); err != nil {
				return inChain(err, tab, c)
			}
		case "set", "map":
			nameTok, err := p.name(t.text)
			if err != nil {
				return err
			}
			if _, err := p.expect(tLBrace, `"{"`); err != nil {
				return err
			}
			if err := p.parseSetBody(tab, nameTok, t.text == "map"); err != nil {
				return err
			}
		case "flags":
			fl, err := p.wordList()
			if err != nil {
				return err
			}
			tab.dormant = false
			for _, f := range fl {
				switch f {
				case "dormant":
					tab.dormant = true
				case "owner", "persist":
				default:
					return p.errTok(t, "table %s: unknown table flag %q", tab.id(), f)
				}
			}
		case "comment":
			s, err := p.expect(tString, "a comment string")
			if err != nil {
				return err
			}
			tab.comment = s.text
		case "counter":
			if err := p.skipCounter(); err != nil {
				return err
			}
		default:
			return p.errTok(t, "table %s: unsupported object %q", tab.id(), t.text)
		}
		if err := p.endOfStatement(); err != nil {
			return err
		}
	}
}

// skipCounter reads a named counter declaration `NAME [{ packets N bytes M ; ... }]`;
// named counters do not affect a packet's path.
func (p *parser) skipCounter() error {
	if _, err := p.name("counter"); err != nil {
		return err
	}
	if p.lx.peek().kind != tLBrace {
		return nil
	}
	p.lx.next()
	for {
		t, err := p.next()
		if err != nil {
			return err
		}
		if t.kind == tRBrace {
			return nil
		}
		if t.kind == tEOF {
			return p.errTok(t, `unterminated counter, expected "}"`)
		}
	}
}

// wordList reads `a,b,c` up to the end of the statement.
func (p *parser) wordList() ([]string, error) {
	var out []string
	for {
		t, err := p.next()
		if err != nil {
			return nil, err
		}
		if t.kind != tWord {
			return nil, p.errTok(t, "expected a word, found %s", t.show())
		}
		out = append(out, t.text)
		if p.lx.peek().kind != tComma {
			return out, nil
		}
		p.lx.next()
	}
}

// parseChainBody reads a chain's body after "{": type/hook/priority/policy/comment
// statements and rules, up to and including "}".
func (p *parser) parseChainBody(c *chain) error {
	for {
		t := p.lx.peek()
		if err := p.lexErr(); err != nil {
			return err
		}
		switch t.kind {
		case tRBrace:
			p.lx.next()
			return nil
		case tNL, tSemi:
			p.lx.next()
			continue
		case tEOF:
			return p.errTok(t, `chain %s: expected "}", found end of input`, c.name)
		}
		if t.kind == tWord {
			switch t.text {
			case "type":
				p.lx.next()
				if err := p.parseBaseSpec(c); err != nil {
					return err
				}
				continue
			case "policy":
				p.lx.next()
				pt, err := p.expect(tWord, "a policy")
				if err != nil {
					return err
				}
				if c.base == nil {
					return p.errTok(pt, "chain %s: policy on a regular chain", c.name)
				}
				switch pt.text {
				case "accept":
					c.base.policy = vAccept
				case "drop":
					c.base.policy = vDrop
				default:
					return p.errTok(pt, "chain %s: unknown policy %q", c.name, pt.text)
				}
				if err := p.endOfStatement(); err != nil {
					return err
				}
				continue
			case "comment":
				// A chain comment stands alone; a rule cannot start with "comment".
				p.lx.next()
				s, err := p.expect(tString, "a comment string")
				if err != nil {
					return err
				}
				c.comment = s.text
				if err := p.endOfStatement(); err != nil {
					return err
				}
				continue
			case "devices", "device":
				return p.errTok(t, "chain %s: devices are not supported", c.name)
			}
		}
		toks, err := p.collectRule()
		if err != nil {
			return err
		}
		if err := p.addRule(c, toks, -1); err != nil {
			return err
		}
	}
}

// collectRule reads a rule's tokens up to the end of line, ";" or a "}" at brace depth
// zero (which it leaves in place).
func (p *parser) collectRule() ([]token, error) {
	var toks []token
	depth := 0
	for {
		t := p.lx.peek()
		if err := p.lexErr(); err != nil {
			return nil, err
		}
		switch t.kind {
		case tEOF:
			if depth > 0 {
				return nil, p.errTok(t, `expected "}", found end of input`)
			}
			return toks, nil
		case tNL:
			if depth == 0 {
				return toks, nil
			}
			p.lx.next()
			continue
		case tSemi:
			if depth == 0 {
				return toks, nil
			}
		case tLBrace:
			depth++
		case tRBrace:
			if depth == 0 {
				return toks, nil
			}
			depth--
		}
		toks = append(toks, p.lx.next())
	}
}

// parseBaseSpec reads `TYPE hook HOOK [device D] priority PRIO` after "type".
func (p *parser) parseBaseSpec(c *chain) error {
	tt, err := p.expect(tWord, "a chain type")
	if err != nil {
		return err
	}
	switch tt.text {
	case "filter", "nat", "route":
	default:
		return p.errTok(tt, "chain %s: unknown chain type %q", c.name, tt.text)
	}
	if _, err := p.expectWord("hook"); err != nil {
		return err
	}
	ht, err := p.expect(tWord, "a hook")
	if err != nil {
		return err
	}
	switch ht.text {
	case "prerouting", "input", "forward", "output", "postrouting":
	default:
		return p.errTok(ht, "chain %s: hook %q is not supported", c.name, ht.text)
	}
	if tt.text == "nat" && ht.text == "forward" {
		return p.errTok(ht, "chain %s: nat chains cannot hook forward", c.name)
	}
	nt := p.lx.peek()
	if nt.kind == tWord && (nt.text == "device" || nt.text == "devices") {
		return p.errTok(nt, "chain %s: devices are not supported", c.name)
	}
	if _, err := p.expectWord("priority"); err != nil {
		return err
	}
	var ptoks []token
	for {
		t := p.lx.peek()
		if t.kind != tWord && t.kind != tOp {
			break
		}
		if t.kind == tWord && t.text == "policy" {
			break
		}
		ptoks = append(ptoks, p.lx.next())
	}
	if len(ptoks) == 0 {
		t := p.lx.peek()
		return p.errTok(t, "chain %s: expected a priority, found %s", c.name, t.show())
	}
	var ptext []string
	for _, t := range ptoks {
		ptext = append(ptext, t.text)
	}
	prioText := strings.Join(ptext, " ")
	prio, err := parsePriority(c.table.family, strings.Join(ptext, ""))
	if err != nil {
		return p.errTok(ptoks[0], "chain %s: %v", c.name, err)
	}
	c.base = &baseChain{typ: tt.text, hook: ht.text, prio: prio, prioText: prioText, policy: vAccept}
	return p.endOfStatement()
}

func (p *parser) expectWord(w string) (token, error) {
	t, err := p.next()
	if err != nil {
		return t, err
	}
	if t.kind != tWord || t.text != w {
		return t, p.errTok(t, "expected %q, found %s", w, t.show())
	}
	return t, nil
}

// parsePriority resolves a chain priority: a number, a named priority of the family
// (raw, mangle, dstnat, filter, security, srcnat), or a name plus or minus a number.
func parsePriority(family, s string) (int, error) {
	prio, err := knftables.ParsePriority(knftables.Family(family), s)
	if err != nil {
		return 0, fmt.Errorf("bad priority %q: %w", s, err)
	}
	return prio, nil
}

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
		fam, _ := p.family()
		nameTok, err := p.name("table")
		if err != nil {
			return err
		}
		tab, err := p.getTable(fam, nameTok, true)
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
		tab, nameTok, err := p.tableAndName("chain")
		if err != nil {
			return err
		}
		c, err := p.getChain(tab, nameTok, true)
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
		tab, nameTok, err := p.tableAndName("chain")
		if err != nil {
			return err
		}
		c, err := p.getChain(tab, nameTok, false)
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

// inChain fills in the table and chain of a CompileError that lacks them.
func inChain(err error, tab *table, c *chain) error {
	var ce *CompileError
	if errors.As(err, &ce) {
		if ce.Table == "" {
			ce.Table = tab.id()
		}
		if ce.Chain == "" && ce.Set == "" {
			ce.Chain = c.name
			ce.Msg = strings.TrimPrefix(ce.Msg, "chain "+c.name+": ")
		}
	}
	return err
}

func withSet(err error, tab *table, s *setDef) error {
	var ce *CompileError
	if errors.As(err, &ce) {
		ce.Table, ce.Set = tab.id(), s.name
	}
	return err
}

// tableAndName reads `[family] table name`.
func (p *parser) tableAndName(what string) (*table, token, error) {
	fam, _ := p.family()
	tt, err := p.name("table")
	if err != nil {
		return nil, tt, err
	}
	tab, err := p.getTable(fam, tt, false)
	if err != nil {
		return nil, tt, err
	}
	nt, err := p.name(what)
	return tab, nt, err
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
		fam, _ := p.family()
		nt, err := p.name("table")
		if err != nil {
			return err
		}
		tab, err := p.getTable(fam, nt, false)
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
		tab, nt, err := p.tableAndName("chain")
		if err != nil {
			return err
		}
		c, err := p.getChain(tab, nt, false)
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

// addRule compiles a rule's tokens and inserts it at pos (-1: append).
func (p *parser) addRule(c *chain, toks []token, pos int) error {
	idx := len(c.rules)
	if pos >= 0 {
		idx = pos
	}
	text := p.src[toks[0].off:toks[len(toks)-1].end]
	rp := &ruleParser{p: p, tab: c.table, chain: c, toks: toks, ruleIdx: idx, text: text}
	stmts, err := rp.parseRule()
	if err != nil {
		return rp.wrap(err)
	}
	r := &rule{text: text, stmts: stmts, line: toks[0].line}
	if pos < 0 || pos >= len(c.rules) {
		c.rules = append(c.rules, r)
	} else {
		c.rules = append(c.rules[:pos], append([]*rule{r}, c.rules[pos:]...)...)
	}
	return nil
}
