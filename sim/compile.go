package sim

import (
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/knftables"
)

// Hook is a netfilter hook.
type Hook string

// The netfilter hooks a packet can traverse.
const (
	HookPrerouting  Hook = "prerouting"
	HookInput       Hook = "input"
	HookForward     Hook = "forward"
	HookOutput      Hook = "output"
	HookPostrouting Hook = "postrouting"
	// HookIngress and HookEgress are the per-device hooks of netdev (and inet
	// ingress) chains: before prerouting on the input interface, after postrouting
	// on the output interface.
	HookIngress Hook = "ingress"
	HookEgress  Hook = "egress"
)

// numHooks counts the hooks: the five IP hooks, then ingress and egress.
const numHooks = 7

var hookIndex = map[string]int{"prerouting": 0, "input": 1, "forward": 2, "output": 3, "postrouting": 4, "ingress": 5, "egress": 6}
var hookNames = [numHooks]Hook{HookPrerouting, HookInput, HookForward, HookOutput, HookPostrouting, HookIngress, HookEgress}

// Netfilter's fixed priorities for conntrack and NAT (NF_IP_PRI_*).
const (
	prioConntrack = -200
	prioNATDst    = -100
	prioNATSrc    = 100
	prioConfirm   = int(^uint(0)>>1) - 1
)

type entryKind uint8

const (
	eChain     entryKind = iota // a filter or route base chain
	eNAT                        // all nat base chains of the hook, run as one NAT step
	eConntrack                  // conntrack lookup (prerouting, output)
	eConfirm                    // conntrack confirmation (postrouting, input)
)

// hookEntry is one thing that runs at a hook, in priority order.
type hookEntry struct {
	kind  entryKind
	prio  int
	chain *chain
	nat   []*chain
}

// Program is a compiled ruleset: tables, chains with their rules compiled to statements,
// sets and maps with lookup indexes, and for each family and hook the base chains in
// the order netfilter runs them. A Program is immutable and safe for concurrent use;
// per-trace state lives in a Runtime.
type Program struct {
	tables []*table
	hooks  [2][numHooks][]hookEntry // [IPv4, IPv6][hook]
	// unsupported are the compile errors of what Forks turned into forks.
	unsupported []string
	// bridged are the bridge tables' base chains, which the simulator does not
	// trace (its packets are routed, not bridged).
	bridged []string
}

// CompileText compiles nft ruleset text. It accepts the command form that
// knftables.Fake.Dump and `nft -f` scripts use (`add table ip t`, `add chain ...`,
// `add rule ...`, `add set/map ...`, `add element ...`, also insert, flush, delete),
// the nested form `nft list ruleset` prints (`table ip t { chain c { ... } }`), and a
// mix of both, and the JSON `nft -j list ruleset` prints (CompileJSON). Unsupported syntax is a *CompileError naming the table, chain, rule
// and column.
func CompileText(src string) (*Program, error) {
	return CompileTextOptions(src, CompileOptions{})
}

// CompileOptions change what Compile* accepts.
type CompileOptions struct {
	// Forks accepts what a packet cannot decide — limit rate, quota, ct count (also
	// in set elements and meters), xt matches and targets (whose payload nft does
	// not show), socket, tproxy, osf, queue, ether and vlan, TCP option timestamps
	// and SACK blocks, meta random other than iptables' statistic, meta time, day,
	// hour and cpu — as forks: a trace follows both outcomes, each branch labelled with
	// what it assumes (Branch.Assumptions, "under limit rate 10/second"). Without it
	// each is a *CompileError, so that a ruleset that compiles is one whose every
	// path the packet decides (numgen random and statistic forks carry
	// probabilities), but for the owner of a node's own packet's socket (meta
	// skuid, skgid), which forks either way. With Forks a statement the simulator
	// does not know at all is a fork labelled "unsupported ..." too
	// (Program.Unsupported), so that no ruleset nft lists is refused.
	Forks bool
}

// CompileTextOptions is CompileText with options. Like CompileText it also reads
// `nft -j list ruleset` output (CompileJSON).
func CompileTextOptions(src string, o CompileOptions) (*Program, error) {
	if isJSON(src) {
		return CompileJSON([]byte(src), o)
	}
	p := newParser(src)
	p.opts = o
	if err := p.parseFile(); err != nil {
		return nil, err
	}
	return p.finish()
}

// CompileFake compiles the ruleset held by a knftables.Fake, from its Dump text, so
// that the simulator reads exactly what the proxier would send to `nft -f`.
func CompileFake(f *knftables.Fake) (*Program, error) {
	if f == nil {
		return nil, fmt.Errorf("compile fake: nil *knftables.Fake")
	}
	prog, err := CompileText(f.Dump())
	if err != nil {
		return nil, fmt.Errorf("compile fake dump: %w", err)
	}
	return prog, nil
}

func (p *parser) finish() (*Program, error) {
	for _, r := range p.refs {
		c, ok := r.table.chains[r.v.chainName]
		if !ok || !p.tableLive(r.table) {
			e := r.ctx
			e.Msg = fmt.Sprintf("no such chain %q", r.v.chainName)
			return nil, &e
		}
		if c.base != nil {
			e := r.ctx
			e.Msg = fmt.Sprintf("cannot %s to base chain %q", map[verdictKind]string{vJump: "jump", vGoto: "goto"}[r.v.kind], c.name)
			return nil, &e
		}
		r.v.chain = c
	}
	for _, u := range p.setUses {
		if u.set.deleted {
			e := u.ctx
			e.Msg = fmt.Sprintf("set %q was deleted while in use", u.set.name)
			return nil, &e
		}
	}
	for _, t := range p.tableL {
		for _, s := range t.setL {
			s.build()
		}
	}
	prog := &Program{tables: p.tableL, unsupported: p.unsupported}
	if err := prog.checkLoops(); err != nil {
		return nil, err
	}
	if err := prog.checkHooks(); err != nil {
		return nil, err
	}
	prog.buildHooks()
	return prog, nil
}

func (p *parser) tableLive(t *table) bool {
	return p.tables[t.id()] == t
}

// targets returns the chains a rule can jump or go to.
func ruleTargets(r *rule) []*chain {
	var out []*chain
	for _, s := range r.stmts {
		switch s := s.(type) {
		case *verdictStmt:
			if s.v.chain != nil {
				out = append(out, s.v.chain)
			}
		case *vmapStmt:
			for _, v := range s.set.live {
				if v.chain != nil {
					out = append(out, v.chain)
				}
			}
		}
	}
	return out
}

// chainTargets returns the distinct chains c can jump or go to.
func chainTargets(c *chain) []*chain {
	seen := map[*chain]bool{}
	var out []*chain
	for _, r := range c.rules {
		for _, t := range ruleTargets(r) {
			if !seen[t] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	return out
}

// checkLoops rejects jump/goto cycles, as the kernel does (ELOOP).
func (prog *Program) checkLoops() error {
	const (
		white = iota
		grey
		black
	)
	color := map[*chain]int{}
	targets := map[*chain][]*chain{}
	var visit func(c *chain, path []string) error
	visit = func(c *chain, path []string) error {
		color[c] = grey
		path = append(path, c.name)
		ts, ok := targets[c]
		if !ok {
			ts = chainTargets(c)
			targets[c] = ts
		}
		for _, t := range ts {
			switch color[t] {
			case grey:
				return &CompileError{Table: c.table.id(), Chain: t.name, Rule: -1,
					Msg: "chain loop: " + strings.Join(append(path, t.name), " -> ")}
			case white:
				if err := visit(t, path); err != nil {
					return err
				}
			}
		}
		color[c] = black
		return nil
	}
	for _, t := range prog.tables {
		for _, c := range t.chainL {
			if color[c] == white {
				if err := visit(c, nil); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// checkHooks rejects NAT statements where the kernel would: outside nat chains, dnat
// and redirect outside prerouting/output, snat and masquerade outside
// postrouting/input.
func (prog *Program) checkHooks() error {
	for _, t := range prog.tables {
		for _, bc := range t.chainL {
			if bc.base == nil {
				continue
			}
			seen := map[*chain]bool{}
			var walk func(c *chain) error
			walk = func(c *chain) error {
				if seen[c] {
					return nil
				}
				seen[c] = true
				for i, r := range c.rules {
					for _, s := range r.stmts {
						ns, ok := s.(*natStmt)
						if !ok {
							continue
						}
						bad := ""
						h := bc.base.hook
						switch {
						case bc.base.typ != "nat":
							bad = fmt.Sprintf("%s in a %s chain (reached from base chain %s); NAT needs a nat chain", ns.kindName(), bc.base.typ, bc.name)
						case (ns.kind == natDNAT || ns.kind == natRedirect) && h != "prerouting" && h != "output":
							bad = fmt.Sprintf("%s at hook %s (reached from base chain %s); only prerouting and output", ns.kindName(), h, bc.name)
						case (ns.kind == natSNAT || ns.kind == natMasquerade) && h != "postrouting" && h != "input":
							bad = fmt.Sprintf("%s at hook %s (reached from base chain %s); only postrouting and input", ns.kindName(), h, bc.name)
						}
						if bad != "" {
							return &CompileError{Table: t.id(), Chain: c.name, Rule: i, RuleText: r.text, Line: r.line, Msg: bad}
						}
					}
				}
				for _, tc := range chainTargets(c) {
					if err := walk(tc); err != nil {
						return err
					}
				}
				return nil
			}
			if err := walk(bc); err != nil {
				return err
			}
		}
	}
	return nil
}

func (prog *Program) buildHooks() {
	prog.bridged = nil
	for _, t := range prog.tables {
		for _, c := range t.chainL {
			if t.family == "bridge" && c.base != nil && !t.dormant {
				prog.bridged = append(prog.bridged, t.id()+" chain "+c.name)
			}
		}
	}
	for fi := 0; fi < 2; fi++ {
		for hi := 0; hi < numHooks; hi++ {
			var entries []hookEntry
			h := hookNames[hi]
			if h == HookPrerouting || h == HookOutput {
				entries = append(entries, hookEntry{kind: eConntrack, prio: prioConntrack})
			}
			var nat []*chain
			for _, t := range prog.tables {
				// netdev chains hook only ingress and egress, and see both families.
				if t.dormant || !(t.family == "inet" || t.family == "netdev" || (t.family == "ip" && fi == 0) || (t.family == "ip6" && fi == 1)) {
					continue
				}
				for _, c := range t.chainL {
					if c.base == nil || c.base.hook != string(h) {
						continue
					}
					if c.base.typ == "nat" {
						nat = append(nat, c)
						continue
					}
					entries = append(entries, hookEntry{kind: eChain, prio: c.base.prio, chain: c})
				}
			}
			if hi < 5 && h != HookForward {
				sort.SliceStable(nat, func(i, j int) bool { return nat[i].base.prio < nat[j].base.prio })
				prio := prioNATSrc
				if h == HookPrerouting || h == HookOutput {
					prio = prioNATDst
				}
				entries = append(entries, hookEntry{kind: eNAT, prio: prio, nat: nat})
			}
			if h == HookPostrouting || h == HookInput {
				entries = append(entries, hookEntry{kind: eConfirm, prio: prioConfirm})
			}
			// Netfilter runs hooks by priority; of equal priorities the earlier
			// registered runs first. Conntrack and NAT register before the tables'
			// chains, and chains in the order they were created.
			sort.SliceStable(entries, func(i, j int) bool {
				a, b := entries[i], entries[j]
				if a.prio != b.prio {
					return a.prio < b.prio
				}
				return a.kind != eChain && b.kind == eChain
			})
			prog.hooks[fi][hi] = entries
		}
	}
}

// Tables returns "family name" of each table, in the order they were defined.
func (prog *Program) Tables() []string {
	var out []string
	for _, t := range prog.tables {
		out = append(out, t.id())
	}
	return out
}
