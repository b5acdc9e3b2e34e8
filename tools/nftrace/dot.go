package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/sim"
)

// dotGraph draws the paths of traced packets for Graphviz (-o dot): each packet is a
// cluster, its path hooks → chains → the rules that matched → the outcome. The
// branches of a fork share the nodes where they agree, and an edge taken by some
// branches only is labelled with their probability.
type dotGraph struct {
	b       strings.Builder
	packets int
}

// maxRuleLabel bounds a rule's text in a node; longer text is cut with "…".
const maxRuleLabel = 60

// add draws one traced packet; at is its time in a sequence, or "".
func (g *dotGraph) add(tr *sim.Trace, at string) {
	g.packets++
	p := g.packets
	label := tr.Packet.String()
	if at != "" {
		label += " (at +" + at + ")"
	}
	fmt.Fprintf(&g.b, "  subgraph cluster_%d {\n    label=%s;\n    fontname=\"Helvetica-Bold\";\n", p, dotQuote(label))
	ids := map[string]string{}
	var nodes []string
	node := func(key, attrs string) string {
		if id, ok := ids[key]; ok {
			return id
		}
		id := fmt.Sprintf("p%dn%d", p, len(ids))
		ids[key] = id
		nodes = append(nodes, fmt.Sprintf("    %s [%s];\n", id, attrs))
		return id
	}
	type edge struct{ from, to string }
	// prob is each edge's probability under each set of assumptions (the branches
	// of one set sum to 1); cases are those sets, in the order of the branches.
	prob := map[edge]map[string]float64{}
	var edges []edge
	var cases []string
	for _, br := range tr.Branches {
		asm := strings.Join(br.Assumptions(), " and ")
		if !slices.Contains(cases, asm) {
			cases = append(cases, asm)
		}
		used := map[edge]bool{}
		prev := ""
		link := func(id string) {
			if prev != "" {
				e := edge{prev, id}
				if !used[e] {
					used[e] = true
					if _, ok := prob[e]; !ok {
						edges = append(edges, e)
						prob[e] = map[string]float64{}
					}
					prob[e][asm] += br.Probability
				}
			}
			prev = id
		}
		for _, s := range br.Steps {
			where := string(s.Hook) + "|" + s.Table + "|" + s.Chain
			switch {
			case s.Kind == sim.StepHook:
				link(node("hook|"+string(s.Hook), fmt.Sprintf(`label=%s, shape=box, style="rounded,filled", fillcolor="#cfe2f3", fontname="Helvetica-Bold"`, dotQuote("hook "+string(s.Hook)))))
			case s.Kind == sim.StepChain:
				link(node("chain|"+where, fmt.Sprintf(`label=%s, shape=box, style=rounded, fontname="Helvetica"`, dotQuote("chain "+s.Chain+"\n"+s.Table))))
			case s.Kind == sim.StepRule && s.Matched:
				text := fmt.Sprintf("[%d] %s", s.Rule, s.RuleText)
				if len([]rune(text)) > maxRuleLabel {
					text = string([]rune(text)[:maxRuleLabel-1]) + "…"
				}
				if v := s.Verdict; v != "" && !strings.HasPrefix(v, "jump ") && !strings.HasPrefix(v, "goto ") {
					text += "\n→ " + v
				}
				link(node(fmt.Sprintf("rule|%s|%d", where, s.Rule), fmt.Sprintf(`label=%s, shape=box, fontname="Courier", fontsize=10`, dotQuote(text))))
			case s.Kind == sim.StepPolicy && s.Verdict != "accept":
				link(node("policy|"+where, fmt.Sprintf(`label=%s, shape=box, fontname="Courier", fontsize=10`, dotQuote("policy "+s.Verdict))))
			}
		}
		o := br.Outcome
		text := strings.ToUpper(o.Verdict.String())
		color := "#f4cccc"
		if o.Verdict == sim.VerdictAccept {
			text += " (" + o.Delivery.String() + ")\n" + o.Packet.String()
			color = "#d9ead3"
			if o.Masquerade {
				text += "\nmasquerade to " + o.SNATAddr.String()
			} else if o.SNAT {
				text += "\nsnat to " + o.SNATAddr.String()
			}
		} else if o.Reject != "" {
			text += " with " + o.Reject
		}
		link(node("outcome|"+text, fmt.Sprintf(`label=%s, shape=box, style="filled,bold", fillcolor=%q, fontname="Helvetica"`, dotQuote(text), color)))
	}
	for _, n := range nodes {
		g.b.WriteString(n)
	}
	for _, e := range edges {
		fmt.Fprintf(&g.b, "    %s -> %s", e.from, e.to)
		if l := edgeLabel(prob[e], cases); l != "" {
			fmt.Fprintf(&g.b, " [label=%s]", dotQuote(l))
		}
		g.b.WriteString(";\n")
	}
	g.b.WriteString("  }\n")
}

// edgeLabel labels an edge taken with probability p[asm] under each set of
// assumptions asm of cases: nothing when every case takes it surely, the
// probability when every case takes it as likely (or nothing is assumed), else "if ASSUMPTIONS" (with the
// probability when below 1) for each case that takes it.
func edgeLabel(p map[string]float64, cases []string) string {
	all := len(p) == len(cases)
	sure, same := true, true
	for _, x := range p {
		sure = sure && x >= 0.9999
		same = same && math.Abs(x-p[cases[0]]) < 1e-9
	}
	switch {
	case all && sure:
		return ""
	case all && same:
		// As likely whatever is assumed.
		return fmt.Sprintf("%.4g%%", p[cases[0]]*100)
	}
	var lines []string
	for _, c := range cases {
		x, ok := p[c]
		if !ok {
			continue
		}
		l := "if " + c
		if c == "" {
			l = "assuming nothing"
		}
		if x < 0.9999 {
			l += fmt.Sprintf(": %.4g%%", x*100)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}

// write prints the graph.
func (g *dotGraph) write(w io.Writer) error {
	_, err := fmt.Fprintf(w, "digraph nftrace {\n  rankdir=TB;\n  node [fontsize=11];\n  edge [fontname=\"Helvetica\", fontsize=10];\n%s}\n", g.b.String())
	return err
}

// dotQuote quotes s as a Graphviz string; newlines become centred line breaks.
func dotQuote(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `"`, `\"`)
	s = strings.ReplaceAll(s, "\n", `\n`)
	return `"` + s + `"`
}
