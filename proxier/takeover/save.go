package takeover

import (
	"fmt"
	"strings"
)

// ParseSave reads the output of iptables-save (every table it holds) into Tables, in
// the order of the dump.
func ParseSave(dump string) ([]*Table, error) {
	var (
		tables []*Table
		cur    *Table
	)
	for i, line := range strings.Split(dump, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			cur = &Table{Name: line[1:]}
			tables = append(tables, cur)
		case line == "COMMIT":
			cur = nil
		case cur == nil:
			return nil, fmt.Errorf("iptables-save line %d: %q outside a table", i+1, line)
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			cur.Chains = append(cur.Chains, name)
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			cur.Rules = append(cur.Rules, Rule{Chain: chain, Spec: spec, Target: target(spec)})
		default:
			return nil, fmt.Errorf("iptables-save line %d: unexpected %q", i+1, line)
		}
	}
	return tables, nil
}

// target returns the argument of a rule's -j or -g, or "".
func target(spec string) string {
	words := splitWords(spec)
	for i := 0; i+1 < len(words); i++ {
		if words[i] == "-j" || words[i] == "--jump" || words[i] == "-g" || words[i] == "--goto" {
			return words[i+1]
		}
	}
	return ""
}

// splitWords splits a rule spec at blanks outside double quotes (iptables-save quotes
// comments, and escapes quotes inside them with a backslash), so that a comment's words
// are never taken for options.
func splitWords(s string) []string {
	var (
		words   []string
		cur     strings.Builder
		quoted  bool
		escaped bool
		started bool
	)
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && quoted:
			escaped = true
		case r == '"':
			quoted, started = !quoted, true
		case r == ' ' && !quoted:
			if started {
				words = append(words, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteRune(r)
			started = true
		}
	}
	if started {
		words = append(words, cur.String())
	}
	return words
}

// restoreScript is the input of `iptables-restore --noflush` that makes o in table in
// one commit: rules deleted by their spec, chains flushed (redeclaring a chain flushes
// it), chains deleted.
func restoreScript(table string, o ops) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", table)
	for _, c := range o.flush {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, r := range o.rules {
		fmt.Fprintf(&b, "-D %s %s\n", r.Chain, r.Spec)
	}
	for _, c := range o.chain {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
