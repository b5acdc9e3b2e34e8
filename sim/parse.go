package sim

import (
	"errors"
	"fmt"
	"strings"
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
	// unsupported are the errors of statements compiled as forks (CompileOptions.Forks).
	unsupported []string
	// setUses are the named sets rules refer to, checked for deletion at the end.
	setUses []setUse
	opts    CompileOptions
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
	if !families[fam] {
		return nil, p.errTok(nameTok, "table %s: unknown family %s", key, fam)
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

// openTable reads `[family] table` and returns the table, created first when
// create, and its name.
func (p *parser) openTable(create bool) (*table, token, error) {
	fam, _ := p.family()
	tt, err := p.name("table")
	if err != nil {
		return nil, tt, err
	}
	tab, err := p.getTable(fam, tt, create)
	return tab, tt, err
}

// openChain reads `[family] table chain` and returns the table and the chain,
// created first when create.
func (p *parser) openChain(create bool) (*table, *chain, error) {
	tab, nt, err := p.tableAndName("chain")
	if err != nil {
		return nil, nil, err
	}
	c, err := p.getChain(tab, nt, create)
	return tab, c, err
}

// tableAndName reads `[family] table name`: an existing table and the name of an
// object in it.
func (p *parser) tableAndName(what string) (*table, token, error) {
	tab, tt, err := p.openTable(false)
	if err != nil {
		return nil, tt, err
	}
	nt, err := p.name(what)
	return tab, nt, err
}
