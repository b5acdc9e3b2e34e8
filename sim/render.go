package sim

import (
	"fmt"
	"strings"
)

// String renders the trace as indented text: the packet, then for each branch its
// probability and choices, the chain path through every hook, and the outcome.
func (t *Trace) String() string {
	var b strings.Builder
	b.WriteString(t.Packet.String())
	b.WriteByte('\n')
	for i, br := range t.Branches {
		if len(t.Branches) > 1 {
			fmt.Fprintf(&b, "branch %d of %d, probability %s", i+1, len(t.Branches), formatProb(br.Probability))
			if i == t.Committed {
				b.WriteString(" (committed)")
			}
			b.WriteByte('\n')
			for _, ch := range br.Choices {
				switch {
				case ch.Assumed:
					fmt.Fprintf(&b, "  assuming: %s (%s chain %s rule %d)\n", ch.Outcome, ch.Table, ch.Chain, ch.Rule)
				case ch.Outcome != "":
					fmt.Fprintf(&b, "  choice: %s, probability %s (%s chain %s rule %d)\n", ch.Outcome, formatProb(ch.Probability), ch.Table, ch.Chain, ch.Rule)
				default:
					fmt.Fprintf(&b, "  choice: %s = %d (%s chain %s rule %d)\n", ch.Expr, ch.Value, ch.Table, ch.Chain, ch.Rule)
				}
			}
		}
		br.render(&b)
	}
	if len(t.Branches) > 1 {
		b.WriteString("endpoints:\n")
		for _, e := range t.Endpoints() {
			if e.Assumptions != "" {
				fmt.Fprintf(&b, "  assuming %s:", e.Assumptions)
			}
			fmt.Fprintf(&b, "  %s %s", formatProb(e.Probability), e.Verdict)
			if e.Verdict == VerdictAccept {
				fmt.Fprintf(&b, " %s %s", e.Delivery, formatAddrPort(e.Addr, t.Packet.Protocol))
			} else {
				fmt.Fprintf(&b, " (to %s)", formatAddrPort(e.Addr, t.Packet.Protocol))
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func formatProb(p float64) string {
	s := fmt.Sprintf("%.4f", p)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "" {
		return "0"
	}
	return s
}

func (br *Branch) render(b *strings.Builder) {
	for _, s := range br.Steps {
		ind := strings.Repeat("  ", s.Depth+1)
		switch s.Kind {
		case StepHook:
			fmt.Fprintf(b, "%shook %s: %s\n", ind, s.Hook, s.Detail)
		case StepChain:
			if s.Depth == 1 {
				fmt.Fprintf(b, "%stable %s chain %s (%s)\n", ind, s.Table, s.Chain, s.Detail)
			} else {
				fmt.Fprintf(b, "%schain %s (%s)\n", ind, s.Chain, s.Detail)
			}
		case StepRule:
			fmt.Fprintf(b, "%s[%d] %s", ind, s.Rule, s.RuleText)
			switch {
			case !s.Matched && s.Expr != s.RuleText:
				fmt.Fprintf(b, "  -- no match: %s", s.Expr)
			case !s.Matched:
				b.WriteString("  -- no match")
			case s.Verdict != "":
				fmt.Fprintf(b, "  -> %s", s.Verdict)
			}
			if s.Detail != "" {
				fmt.Fprintf(b, "  (%s)", s.Detail)
			}
			b.WriteByte('\n')
		case StepPolicy:
			fmt.Fprintf(b, "%spolicy %s\n", strings.Repeat("  ", s.Depth+2), s.Verdict)
		case StepReturn:
			fmt.Fprintf(b, "%s%s: return from %s\n", strings.Repeat("  ", s.Depth+1), s.Detail, s.Chain)
		case StepConntrack:
			fmt.Fprintf(b, "%sconntrack: %s\n", ind, s.Detail)
		case StepNAT:
			fmt.Fprintf(b, "%snat: %s\n", ind, s.Detail)
		case StepRoute:
			fmt.Fprintf(b, "%srouting: %s\n", ind, s.Detail)
		default:
			fmt.Fprintf(b, "%s%s\n", ind, s.Detail)
		}
	}
	o := br.Outcome
	fmt.Fprintf(b, "  => %s", o.Verdict)
	switch o.Verdict {
	case VerdictAccept:
		fmt.Fprintf(b, ", %s: %s", deliveryText(o.Delivery), o.Packet)
		var nat []string
		if o.DNAT {
			nat = append(nat, "dnat")
		}
		if o.Masquerade {
			nat = append(nat, "masquerade to "+o.SNATAddr.String())
		} else if o.SNAT {
			nat = append(nat, "snat to "+o.SNATAddr.String())
		}
		if len(nat) > 0 {
			fmt.Fprintf(b, " (%s)", strings.Join(nat, ", "))
		}
	default:
		if o.Reject != "" {
			fmt.Fprintf(b, " with %s", o.Reject)
		}
		where := fmt.Sprintf(" at hook %s, table %s chain %s", o.Hook, o.Table, o.Chain)
		if o.Rule >= 0 {
			where += fmt.Sprintf(" rule %d", o.Rule)
		} else {
			where += " policy"
		}
		b.WriteString(where)
	}
	b.WriteByte('\n')
}

func deliveryText(d Delivery) string {
	switch d {
	case DeliveryLocal:
		return "delivered locally"
	case DeliveryForward:
		return "forwarded"
	case DeliveryOut:
		return "sent out"
	}
	return "not delivered"
}
