package sim

// parseRule compiles a rule's statements. Compiled with forks, a statement the
// simulator does not know does not refuse the ruleset: it and the tokens after it up
// to the first point from which the rest of the rule compiles become one fork (a
// match that holds or not) or, for a statement that sets something, one stated
// assumption that it is not applied; either is labelled with its text.
func (rp *ruleParser) parseRule() ([]stmt, error) {
	var out []stmt
	for !rp.atEnd() {
		start := rp.i
		s, err := rp.parseStmt()
		if err != nil {
			if !rp.p.opts.Forks {
				return nil, err
			}
			rest, ok := rp.forkUnknown(start)
			if !ok {
				return nil, err
			}
			rp.p.unsupported = append(rp.p.unsupported, rp.wrap(err).Error())
			return append(out, rest...), nil
		}
		out = append(out, s)
	}
	return out, nil
}

// forkUnknown makes the statement at start, which does not compile, and what follows
// it up to a compilable rest of the rule, into a fork, followed by that rest.
func (rp *ruleParser) forkUnknown(start int) ([]stmt, bool) {
	for k := start + 1; k <= len(rp.toks); k++ {
		sub := *rp
		sub.i = k
		var rest []stmt
		ok := true
		for !sub.atEnd() {
			s, err := sub.parseStmt()
			if err != nil {
				ok = false
				break
			}
			rest = append(rest, s)
		}
		if !ok {
			continue
		}
		end := len(rp.toks)
		if k < end {
			end = k
		}
		txt := rp.p.src[rp.toks[start].off:rp.toks[end-1].end]
		f := &forkStmt{txt: txt, outcomes: [2]string{"unsupported " + txt + " holds", "unsupported " + txt + " does not hold"}}
		for _, t := range rp.toks[start:end] {
			if t.kind == tWord && t.text == "set" {
				f.outcomes = [2]string{"unsupported " + txt + " not applied"}
				f.single = true
				break
			}
		}
		rp.i = len(rp.toks)
		return append([]stmt{f}, rest...), true
	}
	return nil, false
}

// Unsupported returns, for a program compiled with forks, the compile errors of the
// statements the simulator does not know that it traces as forks or stated
// assumptions, each naming the table, chain, rule and token; nil when there are
// none.
func (prog *Program) Unsupported() []string { return prog.unsupported }
