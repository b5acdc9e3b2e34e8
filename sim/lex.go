package sim

import (
	"strings"
)

type tokKind uint8

const (
	tEOF    tokKind = iota
	tWord           // identifiers, numbers, addresses, @refs, ranges, prefixes
	tString         // "quoted" (text holds the unquoted value)
	tLBrace         // {
	tRBrace         // }
	tComma          // ,
	tSemi           // ;
	tColon          // : (only when standing alone)
	tNL             // end of line
	tOp             // == != < > <= >= & | ^ = ! << >> ( )
)

func (k tokKind) String() string {
	switch k {
	case tEOF:
		return "end of input"
	case tWord:
		return "word"
	case tString:
		return "string"
	case tLBrace:
		return `"{"`
	case tRBrace:
		return `"}"`
	case tComma:
		return `","`
	case tSemi:
		return `";"`
	case tColon:
		return `":"`
	case tNL:
		return "end of line"
	}
	return "operator"
}

// token is one lexical token of nft syntax, with its position in the source.
type token struct {
	kind tokKind
	text string
	off  int // byte offset of the token's first byte in the source
	end  int // byte offset one past its last byte
	line int // 1-based
	col  int // 1-based byte column in the line
}

// show renders a token for error messages.
func (t token) show() string {
	switch t.kind {
	case tEOF:
		if t.text != "" {
			return t.text
		}
		return t.kind.String()
	case tNL:
		return t.kind.String()
	case tString:
		return `"` + t.text + `"`
	}
	return `"` + t.text + `"`
}

// lexer turns nft source into tokens on demand. '#' starts a comment that runs to the
// end of the line (nft prints "# handle N" that way).
type lexer struct {
	src     string
	pos     int
	line    int
	lineOff int // offset of the current line's first byte
	peeked  []token
	err     *CompileError
}

func newLexer(src string) *lexer { return &lexer{src: src, line: 1} }

func (l *lexer) peek() token {
	if len(l.peeked) == 0 {
		l.peeked = append(l.peeked, l.scan())
	}
	return l.peeked[0]
}

func (l *lexer) next() token {
	if len(l.peeked) > 0 {
		t := l.peeked[0]
		l.peeked = l.peeked[1:]
		return t
	}
	return l.scan()
}

func isOpChar(c byte) bool {
	switch c {
	case '!', '=', '<', '>', '&', '|', '^', '(', ')':
		return true
	}
	return false
}

func isWordBreak(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', '{', '}', ',', ';', '"', '#':
		return true
	}
	return isOpChar(c)
}

func (l *lexer) tok(kind tokKind, start int, text string) token {
	return token{kind: kind, text: text, off: start, end: l.pos, line: l.line, col: start - l.lineOff + 1}
}

func (l *lexer) scan() token {
	src := l.src
	for l.pos < len(src) {
		c := src[l.pos]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			l.pos++
			continue
		case c == '\\' && l.pos+1 < len(src) && src[l.pos+1] == '\n':
			// line continuation
			l.pos += 2
			l.line++
			l.lineOff = l.pos
			continue
		case c == '#':
			for l.pos < len(src) && src[l.pos] != '\n' {
				l.pos++
			}
			continue
		}
		break
	}
	start := l.pos
	if l.pos >= len(src) {
		return l.tok(tEOF, start, "")
	}
	c := src[l.pos]
	switch c {
	case '\n':
		t := l.tok(tNL, start, "\n")
		l.pos++
		t.end = l.pos
		l.line++
		l.lineOff = l.pos
		return t
	case '{', '}', ',', ';':
		l.pos++
		kind := map[byte]tokKind{'{': tLBrace, '}': tRBrace, ',': tComma, ';': tSemi}[c]
		return l.tok(kind, start, string(c))
	case '"':
		l.pos++
		var b strings.Builder
		for l.pos < len(src) && src[l.pos] != '"' && src[l.pos] != '\n' {
			if src[l.pos] == '\\' && l.pos+1 < len(src) && (src[l.pos+1] == '"' || src[l.pos+1] == '\\') {
				l.pos++
			}
			b.WriteByte(src[l.pos])
			l.pos++
		}
		if l.pos >= len(src) || src[l.pos] != '"' {
			t := l.tok(tString, start, b.String())
			if l.err == nil {
				l.err = &CompileError{Line: t.line, Column: t.col, Msg: "unterminated string"}
			}
			return t
		}
		l.pos++
		return l.tok(tString, start, b.String())
	}
	if isOpChar(c) {
		l.pos++
		if l.pos < len(src) {
			two := src[start : l.pos+1]
			switch two {
			case "==", "!=", "<=", ">=", "<<", ">>":
				l.pos++
			}
		}
		return l.tok(tOp, start, src[start:l.pos])
	}
	if c == ':' && (l.pos+1 >= len(src) || isWordBreak(src[l.pos+1])) {
		l.pos++
		return l.tok(tColon, start, ":")
	}
	for l.pos < len(src) && !isWordBreak(src[l.pos]) {
		if src[l.pos] == ':' && l.pos > start && src[l.pos-1] != ':' &&
			(l.pos+1 >= len(src) || isWordBreak(src[l.pos+1])) {
			// "0:" followed by a break: the colon is a map separator.
			break
		}
		l.pos++
	}
	return l.tok(tWord, start, src[start:l.pos])
}
