package sim

import (
	"fmt"
	"strings"
)

// CompileError is the error Compile* returns for a ruleset the simulator cannot read or
// does not support. It names the object the problem is in and where.
type CompileError struct {
	// Table is "family name" of the table, when known.
	Table string
	// Chain is the chain, when the problem is in a chain or one of its rules.
	Chain string
	// Set is the set or map, when the problem is in one or in its elements.
	Set string
	// Rule is the 0-based index of the rule in its chain, or -1.
	Rule int
	// RuleText is the rule's source text, when the problem is in a rule.
	RuleText string
	// Line is the 1-based line in the compiled text.
	Line int
	// Column is 1-based: within RuleText when the problem is in a rule, else within
	// the line.
	Column int
	// Msg says what is wrong.
	Msg string
	// Err is the underlying error, if any.
	Err error
}

// Error renders the error with its position, e.g.
// `table ip t chain c rule 2 "ip daddr 1.2.3.4 frob": line 7 column 18: unsupported ...`.
func (e *CompileError) Error() string {
	var parts []string
	if e.Table != "" {
		parts = append(parts, "table "+e.Table)
	}
	if e.Chain != "" {
		parts = append(parts, "chain "+e.Chain)
	}
	if e.Set != "" {
		parts = append(parts, "set "+e.Set)
	}
	if e.RuleText != "" {
		parts = append(parts, fmt.Sprintf("rule %d %q", e.Rule, e.RuleText))
	}
	var pos []string
	if e.Line > 0 {
		pos = append(pos, fmt.Sprintf("line %d", e.Line))
	}
	if e.Column > 0 {
		pos = append(pos, fmt.Sprintf("column %d", e.Column))
	}
	msg := e.Msg
	if e.Err != nil {
		if msg == "" {
			msg = e.Err.Error()
		} else {
			msg += ": " + e.Err.Error()
		}
	}
	where := strings.Join(parts, " ")
	if len(pos) > 0 {
		if where != "" {
			where += ": "
		}
		where += strings.Join(pos, " ")
	}
	if where == "" {
		return msg
	}
	return where + ": " + msg
}

// Unwrap returns the underlying error.
func (e *CompileError) Unwrap() error { return e.Err }

// TraceError is the error Trace returns when a packet cannot be traced: the packet is
// invalid, or the ruleset misbehaves at run time (jump stack overflow, too many
// branches).
type TraceError struct {
	// Packet is the packet's text form.
	Packet string
	// Msg says what went wrong.
	Msg string
	// Err is the underlying error, if any.
	Err error
}

// Error renders the error.
func (e *TraceError) Error() string {
	msg := e.Msg
	if e.Err != nil {
		if msg == "" {
			msg = e.Err.Error()
		} else {
			msg += ": " + e.Err.Error()
		}
	}
	return "trace " + e.Packet + ": " + msg
}

// Unwrap returns the underlying error.
func (e *TraceError) Unwrap() error { return e.Err }

// posError is an error at a token, raised while parsing a rule, element or declaration;
// the caller adds the object context and turns it into a CompileError.
type posError struct {
	tok token
	msg string
}

func (e *posError) Error() string { return e.msg }

func errAt(t token, format string, args ...any) *posError {
	return &posError{tok: t, msg: fmt.Sprintf(format, args...)}
}
