package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/sim"
)

// Result is the JSON form of one traced packet. It is a stable interface: fields are
// only ever added.
type Result struct {
	// Packet is the packet as given, in its text form.
	Packet string `json:"packet"`
	// Verdict is "accept", "drop" or "reject" when every branch agrees, else "mixed".
	Verdict string `json:"verdict"`
	// Delivery is where an accepted packet went: "local", "forward" or "out" (or
	// "mixed", or "none" when it was dropped or rejected).
	Delivery string `json:"delivery"`
	// Endpoints are the possible destinations after DNAT, with their probabilities;
	// empty when the packet was not DNATed.
	Endpoints []EndpointJSON `json:"endpoints"`
	// Masquerade is true when some branch masquerades the packet.
	Masquerade bool `json:"masquerade"`
	// SNAT is the source address after SNAT or masquerade, when the source changed.
	SNAT string `json:"snat,omitempty"`
	// Steps are the steps of the most probable branch.
	Steps []StepJSON `json:"steps"`
	// Branches are all branches, each with its own outcome and steps.
	Branches []BranchJSON `json:"branches"`
	// Time is, with --sequence, the time the packet is traced at, since the first
	// packet ("0s", then as "advance" moves it).
	Time string `json:"time,omitempty"`
	// Committed is, with --sequence, the index in Branches of the branch the node
	// took: its conntrack entry and set elements are what later packets see.
	Committed *int `json:"committed,omitempty"`
	// Cases are, when some branch assumes what the packet cannot decide (limit
	// rate, xt match, ...), the outcome under each set of assumptions, in the
	// order of the branches.
	Cases []CaseJSON `json:"cases,omitempty"`
}

// CaseJSON is the outcome of a trace should a set of assumptions hold.
type CaseJSON struct {
	Assumptions []string       `json:"assumptions"`
	Verdict     string         `json:"verdict"`
	Delivery    string         `json:"delivery"`
	Endpoints   []EndpointJSON `json:"endpoints"`
	Masquerade  bool           `json:"masquerade"`
	SNAT        string         `json:"snat,omitempty"`
}

// EndpointJSON is a possible DNAT destination.
type EndpointJSON struct {
	Address     string  `json:"address"`
	Probability float64 `json:"probability"`
	// Masquerade is true when the connection to this endpoint is masqueraded.
	Masquerade bool `json:"masquerade"`
	// Assumptions are what the branches to this endpoint assume, when they assume
	// anything; Probability is then conditional on them.
	Assumptions []string `json:"assumptions,omitempty"`
}

// BranchJSON is one numgen branch of a trace.
type BranchJSON struct {
	Probability float64    `json:"probability"`
	Verdict     string     `json:"verdict"`
	Delivery    string     `json:"delivery"`
	DNAT        string     `json:"dnat,omitempty"`
	Masquerade  bool       `json:"masquerade"`
	SNAT        string     `json:"snat,omitempty"`
	Packet      string     `json:"packet"`
	Steps       []StepJSON `json:"steps"`
	// Assumptions are what the branch assumes about what the packet cannot decide
	// ("under limit rate 10/second"); Probability is conditional on them.
	Assumptions []string `json:"assumptions,omitempty"`
}

// StepJSON is one step of a branch.
type StepJSON struct {
	Kind    string `json:"kind"`
	Hook    string `json:"hook,omitempty"`
	Table   string `json:"table,omitempty"`
	Chain   string `json:"chain,omitempty"`
	Rule    *int   `json:"rule,omitempty"`
	Text    string `json:"text,omitempty"`
	Matched bool   `json:"matched,omitempty"`
	Expr    string `json:"expr,omitempty"`
	Verdict string `json:"verdict,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

var stepKinds = map[sim.StepKind]string{
	sim.StepHook: "hook", sim.StepChain: "chain", sim.StepRule: "rule", sim.StepPolicy: "policy",
	sim.StepReturn: "return", sim.StepConntrack: "conntrack", sim.StepNAT: "nat",
	sim.StepRoute: "route", sim.StepNote: "note",
}

// result turns a trace into its JSON form.
func result(tr *sim.Trace) Result {
	r := Result{Packet: tr.Packet.String()}
	assumed := false
	for _, br := range tr.Branches {
		o := br.Outcome
		b := BranchJSON{
			Probability: br.Probability, Verdict: o.Verdict.String(), Delivery: o.Delivery.String(),
			Masquerade: o.Masquerade, Packet: o.Packet.String(), Steps: steps(br.Steps),
			Assumptions: br.Assumptions(),
		}
		if o.DNAT {
			b.DNAT = o.Packet.Dst.String()
		}
		if o.SNAT {
			b.SNAT = o.SNATAddr.String()
		}
		assumed = assumed || len(b.Assumptions) > 0
		r.Branches = append(r.Branches, b)
	}
	all := aggregate(r.Branches)
	r.Verdict, r.Delivery, r.Endpoints, r.Masquerade, r.SNAT = all.Verdict, all.Delivery, all.Endpoints, all.Masquerade, all.SNAT
	if assumed {
		var order []string
		byKey := map[string][]BranchJSON{}
		for _, b := range r.Branches {
			k := strings.Join(b.Assumptions, "\x00")
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], b)
		}
		for _, k := range order {
			c := aggregate(byKey[k])
			c.Assumptions = byKey[k][0].Assumptions
			r.Cases = append(r.Cases, c)
		}
	}
	if len(r.Branches) > 0 {
		r.Steps = r.Branches[0].Steps
	}
	if tr.Committed >= 0 {
		c := tr.Committed
		r.Committed = &c
	}
	return r
}

// aggregate sums up branches: the verdict and delivery they agree on (or "mixed"),
// their DNAT destinations with probabilities (per assumptions: branches of
// different assumptions each sum to 1), masquerading and SNAT.
func aggregate(bs []BranchJSON) CaseJSON {
	c := CaseJSON{Endpoints: []EndpointJSON{}}
	verdicts, deliveries := map[string]bool{}, map[string]bool{}
	dnat := map[string]int{}
	for _, b := range bs {
		if b.DNAT != "" && b.Verdict == "accept" {
			k := b.DNAT + "\x00" + strings.Join(b.Assumptions, "\x00")
			i, ok := dnat[k]
			if !ok {
				i = len(c.Endpoints)
				dnat[k] = i
				c.Endpoints = append(c.Endpoints, EndpointJSON{Address: b.DNAT, Assumptions: b.Assumptions})
			}
			c.Endpoints[i].Probability += b.Probability
			c.Endpoints[i].Masquerade = c.Endpoints[i].Masquerade || b.Masquerade
		}
		if b.SNAT != "" {
			c.SNAT = b.SNAT
		}
		c.Masquerade = c.Masquerade || b.Masquerade
		verdicts[b.Verdict] = true
		deliveries[b.Delivery] = true
	}
	c.Verdict, c.Delivery = agree(verdicts), agree(deliveries)
	return c
}

func agree(set map[string]bool) string {
	if len(set) == 1 {
		for k := range set {
			return k
		}
	}
	if len(set) == 0 {
		return "none"
	}
	return "mixed"
}

func steps(in []sim.Step) []StepJSON {
	out := make([]StepJSON, 0, len(in))
	for _, s := range in {
		j := StepJSON{Kind: stepKinds[s.Kind], Hook: string(s.Hook), Table: s.Table, Chain: s.Chain,
			Text: s.RuleText, Matched: s.Matched, Expr: s.Expr, Verdict: s.Verdict, Detail: s.Detail}
		if s.Kind == sim.StepRule {
			j.Rule = &s.Rule
		}
		out = append(out, j)
	}
	return out
}

// deciding matches the rendering of a rule that decided a packet's fate.
var deciding = regexp.MustCompile(`-> (dnat|snat|masquerade|drop|reject|accept)\b`)

// trace traces every packet and prints the results. With --sequence the packets
// go through one sim.Runtime in order, each seeing the conntrack entries and set
// elements the earlier ones left, on a clock that "advance" moves.
func trace(prog *sim.Program, env sim.Env, entries []entry, o *options, stdout io.Writer) error {
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	color := o.color == "always" || (o.color == "auto" && isTerminal(stdout))
	var rt *sim.Runtime
	var clock *sim.ManualClock
	var elapsed time.Duration
	if o.sequence {
		clock = &sim.ManualClock{}
		env.Clock, env.Seed = clock, o.seed
		if len(o.assume) > 0 {
			env.Select = o.assume.selector(o.seed)
		}
		rt = sim.NewRuntime(prog, env)
	}
	var graph dotGraph
	printed := false
	for _, e := range entries {
		if e.advance > 0 {
			clock.Advance(e.advance)
			elapsed += e.advance
			switch o.output {
			case "text":
				if printed {
					fmt.Fprintln(stdout)
				}
				fmt.Fprintf(stdout, "advance %s: the clock reads +%s\n", e.advance, elapsed)
				printed = true
			case "summary":
				fmt.Fprintf(stdout, "advance %s\n", e.advance)
			}
			continue
		}
		var tr *sim.Trace
		var err error
		if rt != nil {
			tr, err = rt.Trace(e.pkt)
		} else {
			tr, err = prog.Trace(e.pkt, env)
		}
		if err != nil {
			return fmt.Errorf("tracing %s: %w", e.pkt, err)
		}
		o.assume.filter(tr)
		r := result(tr)
		if rt != nil {
			r.Time = elapsed.String()
		}
		switch o.output {
		case "json":
			if err := enc.Encode(r); err != nil {
				return err
			}
		case "summary":
			fmt.Fprintf(stdout, "%s %s\n", r.Packet, summary(r))
		case "dot":
			graph.add(tr, r.Time)
		default:
			if printed {
				fmt.Fprintln(stdout)
			}
			printed = true
			fmt.Fprint(stdout, render(tr, color))
			fmt.Fprintln(stdout, summary(r))
		}
	}
	if o.output == "dot" {
		return graph.write(stdout)
	}
	return nil
}

// render is the simulator's text rendering, with the deciding rules in bold.
func render(tr *sim.Trace, color bool) string {
	text := tr.String()
	if len(tr.Branches) == 1 {
		// The simulator lists a branch's assumptions only when there are several;
		// one left by --assume still assumes them.
		var asm strings.Builder
		for _, ch := range tr.Branches[0].Choices {
			if ch.Assumed {
				fmt.Fprintf(&asm, "  assuming: %s (%s chain %s rule %d)\n", ch.Outcome, ch.Table, ch.Chain, ch.Rule)
			}
		}
		if first, rest, ok := strings.Cut(text, "\n"); ok && asm.Len() > 0 {
			text = first + "\n" + asm.String() + rest
		}
	}
	if !color {
		return text
	}
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if deciding.MatchString(l) {
			lines[i] = "\x1b[1;33m" + l + "\x1b[0m"
		}
	}
	return strings.Join(lines, "\n")
}

// summary is the one-line verdict printed after each trace; when branches assume
// what the packet cannot decide, one clause per set of assumptions
// ("=> if under limit rate 10/second: ACCEPT (local); if over ...: DROP").
func summary(r Result) string {
	var b strings.Builder
	b.WriteString("=> ")
	if len(r.Cases) == 0 {
		b.WriteString(outcome(CaseJSON{Verdict: r.Verdict, Delivery: r.Delivery, Endpoints: r.Endpoints, Masquerade: r.Masquerade, SNAT: r.SNAT}))
	}
	if same, ok := sameOutcome(r.Cases); ok {
		// The assumptions do not change the outcome (a limit on a log rule): say it
		// once, and what was assumed.
		var asm []string
		for _, c := range r.Cases {
			asm = append(asm, strings.Join(c.Assumptions, " and "))
		}
		fmt.Fprintf(&b, "%s in every case (%s)", same, strings.Join(asm, "; "))
		r.Cases = nil
	}
	for i, c := range r.Cases {
		if i > 0 {
			b.WriteString("; ")
		}
		if len(c.Assumptions) > 0 {
			fmt.Fprintf(&b, "if %s: ", strings.Join(c.Assumptions, " and "))
		}
		b.WriteString(outcome(c))
	}
	if r.Committed != nil && len(r.Branches) > 1 {
		br := r.Branches[*r.Committed]
		fmt.Fprintf(&b, "; committed branch %d", *r.Committed+1)
		if br.DNAT != "" {
			fmt.Fprintf(&b, " (to %s)", br.DNAT)
		}
	}
	return b.String()
}

// sameOutcome returns the outcome of cases when there are several and all agree.
func sameOutcome(cases []CaseJSON) (string, bool) {
	if len(cases) < 2 {
		return "", false
	}
	first := outcome(cases[0])
	for _, c := range cases[1:] {
		if outcome(c) != first {
			return "", false
		}
	}
	return first, true
}

// outcome is the verdict, endpoints and masquerading of a trace or of one case.
func outcome(c CaseJSON) string {
	var b strings.Builder
	b.WriteString(strings.ToUpper(c.Verdict))
	if c.Verdict == "accept" {
		fmt.Fprintf(&b, " (%s)", c.Delivery)
	}
	for i, e := range c.Endpoints {
		if i == 0 {
			b.WriteString(" to ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%.0f%%", e.Address, e.Probability*100)
		if e.Masquerade {
			b.WriteString(", masqueraded")
		}
		b.WriteString(")")
	}
	if c.Masquerade && len(c.Endpoints) == 0 {
		b.WriteString(", masqueraded")
	}
	if c.SNAT != "" && len(c.Endpoints) == 0 {
		fmt.Fprintf(&b, ", source becomes %s", c.SNAT)
	}
	return b.String()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
