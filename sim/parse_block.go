package sim

import (
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"
)

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
		case "flowtable":
			// A flowtable offloads connections a "flow add" sent to it: their later
			// packets skip the hooks, which a trace of one packet does not reach.
			if err := p.skipObject("flowtable"); err != nil {
				return err
			}
		case "limit", "quota":
			// Named limits and quotas: the rules that use them ("limit name x")
			// fork (CompileOptions.Forks) or fail to compile.
			if err := p.skipCounter(); err != nil {
				return err
			}
		case "ct":
			k, err := p.next()
			if err != nil {
				return err
			}
			if k.kind != tWord || (k.text != "helper" && k.text != "timeout" && k.text != "expectation") {
				return p.errTok(k, "table %s: unsupported object \"ct %s\"", tab.id(), k.text)
			}
			// ct helper, timeout and expectation objects shape related flows and
			// timeouts, not the path of a packet. (A timeout policy nests braces.)
			if err := p.skipObject("ct " + k.text); err != nil {
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

// skipObject reads a declaration `NAME { ... }` whose body may nest braces.
func (p *parser) skipObject(what string) error {
	if _, err := p.name(what); err != nil {
		return err
	}
	if _, err := p.expect(tLBrace, `"{"`); err != nil {
		return err
	}
	for depth := 1; depth > 0; {
		t, err := p.next()
		if err != nil {
			return err
		}
		switch t.kind {
		case tLBrace:
			depth++
		case tRBrace:
			depth--
		case tEOF:
			return p.errTok(t, `unterminated %s, expected "}"`, what)
		}
	}
	return nil
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
	if !familyHooks[c.table.family][ht.text] {
		return p.errTok(ht, "chain %s: hook %q is not supported in family %s", c.name, ht.text, c.table.family)
	}
	if tt.text == "nat" && ht.text == "forward" {
		return p.errTok(ht, "chain %s: nat chains cannot hook forward", c.name)
	}
	var devices []string
	if nt := p.lx.peek(); nt.kind == tWord && (nt.text == "device" || nt.text == "devices") {
		if devices, err = p.parseDevices(c); err != nil {
			return err
		}
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
	c.base = &baseChain{typ: tt.text, hook: ht.text, prio: prio, prioText: prioText, policy: vAccept, devices: devices}
	return p.endOfStatement()
}

// familyHooks are the hooks base chains of each family can use.
var familyHooks = map[string]map[string]bool{
	"ip":     {"prerouting": true, "input": true, "forward": true, "output": true, "postrouting": true},
	"ip6":    {"prerouting": true, "input": true, "forward": true, "output": true, "postrouting": true},
	"inet":   {"prerouting": true, "input": true, "forward": true, "output": true, "postrouting": true, "ingress": true},
	"netdev": {"ingress": true, "egress": true},
	"bridge": {"prerouting": true, "input": true, "forward": true, "output": true, "postrouting": true},
	"arp":    {"input": true, "output": true},
}

// parseDevices reads `device NAME` or `devices = { NAME, ... }`.
func (p *parser) parseDevices(c *chain) ([]string, error) {
	kw := p.lx.next()
	if kw.text == "device" {
		d, err := p.next()
		if err != nil {
			return nil, err
		}
		if d.kind != tWord && d.kind != tString {
			return nil, p.errTok(d, "chain %s: expected a device name, found %s", c.name, d.show())
		}
		return []string{d.text}, nil
	}
	if t := p.lx.next(); t.kind != tOp || t.text != "=" {
		return nil, p.errTok(t, `chain %s: expected "=" after devices, found %s`, c.name, t.show())
	}
	if t := p.lx.next(); t.kind != tLBrace {
		return nil, p.errTok(t, `chain %s: expected "{", found %s`, c.name, t.show())
	}
	var out []string
	for {
		t := p.lx.next()
		switch {
		case t.kind == tRBrace:
			return out, nil
		case t.kind == tComma || t.kind == tNL:
		case t.kind == tWord || t.kind == tString:
			out = append(out, t.text)
		default:
			return nil, p.errTok(t, "chain %s: expected a device name, found %s", c.name, t.show())
		}
	}
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
