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
}

// EndpointJSON is a possible DNAT destination.
type EndpointJSON struct {
	Address     string  `json:"address"`
	Probability float64 `json:"probability"`
	// Masquerade is true when the connection to this endpoint is masqueraded.
	Masquerade bool `json:"masquerade"`
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
	r := Result{Packet: tr.Packet.String(), Endpoints: []EndpointJSON{}}
	verdicts, deliveries := map[string]bool{}, map[string]bool{}
	dnat := map[string]*EndpointJSON{}
	var dnatOrder []string
	for _, br := range tr.Branches {
		o := br.Outcome
		b := BranchJSON{
			Probability: br.Probability, Verdict: o.Verdict.String(), Delivery: o.Delivery.String(),
			Masquerade: o.Masquerade, Packet: o.Packet.String(), Steps: steps(br.Steps),
		}
		if o.DNAT {
			b.DNAT = o.Packet.Dst.String()
			if o.Verdict == sim.VerdictAccept {
				if _, ok := dnat[b.DNAT]; !ok {
					dnatOrder = append(dnatOrder, b.DNAT)
					dnat[b.DNAT] = &EndpointJSON{Address: b.DNAT}
				}
				dnat[b.DNAT].Probability += br.Probability
				dnat[b.DNAT].Masquerade = dnat[b.DNAT].Masquerade || o.Masquerade
			}
		}
		if o.SNAT {
			b.SNAT = o.SNATAddr.String()
			r.SNAT = b.SNAT
		}
		r.Masquerade = r.Masquerade || o.Masquerade
		verdicts[b.Verdict] = true
		deliveries[b.Delivery] = true
		r.Branches = append(r.Branches, b)
	}
	r.Verdict, r.Delivery = agree(verdicts), agree(deliveries)
	for _, a := range dnatOrder {
		r.Endpoints = append(r.Endpoints, *dnat[a])
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

// summary is the one-line verdict printed after each trace.
func summary(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "=> %s", strings.ToUpper(r.Verdict))
	if r.Verdict == "accept" {
		fmt.Fprintf(&b, " (%s)", r.Delivery)
	}
	for i, e := range r.Endpoints {
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
	if r.Masquerade && len(r.Endpoints) == 0 {
		b.WriteString(", masqueraded")
	}
	if r.SNAT != "" && len(r.Endpoints) == 0 {
		fmt.Fprintf(&b, ", source becomes %s", r.SNAT)
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

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
