package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/nftproxy/nftproxy/packet"
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

// trace traces every packet and prints the results.
func trace(prog *sim.Program, env sim.Env, packets []packet.Packet, o *options, stdout io.Writer) error {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	color := o.color == "always" || (o.color == "auto" && isTerminal(stdout))
	for i, p := range packets {
		tr, err := prog.Trace(p, env)
		if err != nil {
			return fmt.Errorf("tracing %s: %w", p, err)
		}
		if o.jsonOut {
			if err := enc.Encode(result(tr)); err != nil {
				return err
			}
			continue
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprint(stdout, render(tr, color))
		fmt.Fprintln(stdout, summary(result(tr)))
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
