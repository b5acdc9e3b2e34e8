package features

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
	"github.com/nftproxy/nftproxy/sim"
)

// Interface names the simulated node uses for each origin of a packet.
const (
	uplinkIf   = "eth0" // external clients
	clusterIf  = "eth1" // pods on other nodes
	defaultPod = "veth"
)

// SimBackend runs scenarios on the simulator: the production state, ruleset and
// syncer code syncs into knftables.Fake tables, which the simulator compiles and
// traces packets through.
type SimBackend struct {
	sc      *Scenario
	fakes   map[knftables.Family]*knftables.Fake
	syncers map[knftables.Family]*syncer.Syncer
	clock   *sim.ManualClock
	rt      *sim.Runtime
}

// NewSimBackend returns a simulator backend.
func NewSimBackend() *SimBackend { return &SimBackend{} }

// Name returns "sim".
func (b *SimBackend) Name() string { return "sim" }

// Start implements Backend.
func (b *SimBackend) Start(sc *Scenario, st *state.ClusterState) error {
	b.sc = sc
	b.clock = sim.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b.fakes = map[knftables.Family]*knftables.Fake{}
	b.syncers = map[knftables.Family]*syncer.Syncer{}
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		b.fakes[fam] = knftables.NewFake(fam, sc.Config.Table)
		b.syncers[fam] = syncer.New(b.fakes[fam])
	}
	return b.Sync(st)
}

// Sync implements Backend: an incremental sync after the first.
func (b *SimBackend) Sync(st *state.ClusterState) error {
	var dumps []string
	type moves struct {
		rs    *ruleset.Ruleset
		moves []changeset.AffinityMove
	}
	var all []moves
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		rs := ruleset.Build(st, b.sc.Config, fam)
		res, err := b.syncers[fam].Sync(context.Background(), rs)
		if err != nil {
			return fmt.Errorf("sync %s: %w", fam, err)
		}
		dumps = append(dumps, b.fakes[fam].Dump())
		all = append(all, moves{rs, res.AffinityMoves})
	}
	prog, err := sim.CompileText(strings.Join(dumps, ""))
	if err != nil {
		return fmt.Errorf("compiling the synced ruleset: %w", err)
	}
	// Keep the runtime's state across syncs, as the kernel keeps affinity sets.
	if b.rt == nil {
		b.rt = sim.NewRuntime(prog, b.env())
		return nil
	}
	// The Syncer moves the affinity records of the kernel's sets; the simulator's
	// records live in its runtime, so the same moves are made there: taken out
	// before the new ruleset is loaded (it may drop the set they are in), put back
	// after.
	type put struct {
		table, set string
		taken      *sim.Taken
		timeout    time.Duration
	}
	var puts []put
	for _, m := range all {
		nodeIPs := m.rs.NodePortIPs()
		table := string(m.rs.Family) + " " + m.rs.Table
		for _, mv := range m.moves {
			taken := b.rt.TakeElements(table, mv.From, func(f []string) bool { return mv.Matches(f, nodeIPs) })
			if mv.To != "" {
				timeout, _ := time.ParseDuration(mv.Timeout + "s")
				puts = append(puts, put{table, mv.To, taken, timeout})
			}
		}
	}
	b.rt.Load(prog)
	for _, p := range puts {
		if err := b.rt.PutElements(p.table, p.set, p.taken, p.timeout); err != nil {
			return fmt.Errorf("moving affinity records: %w", err)
		}
	}
	return nil
}

// Ruleset returns the synced tables as nft text.
func (b *SimBackend) Ruleset() string {
	return b.fakes[knftables.IPv4Family].Dump() + b.fakes[knftables.IPv6Family].Dump()
}

func (b *SimBackend) env() sim.Env {
	env := sim.Env{LocalAddrs: b.sc.Node.Addresses, Clock: b.clock, Seed: 1}
	for _, c := range b.sc.Node.PodCIDRs {
		env.Routes = append(env.Routes, sim.Route{Prefix: c, Dev: podIf(b.sc)})
	}
	for _, c := range b.sc.Config.ClusterCIDRs {
		env.Routes = append(env.Routes, sim.Route{Prefix: c, Dev: clusterIf})
	}
	env.Routes = append(env.Routes,
		sim.Route{Prefix: netip.MustParsePrefix("0.0.0.0/0"), Dev: uplinkIf},
		sim.Route{Prefix: netip.MustParsePrefix("::/0"), Dev: uplinkIf})
	return env
}

func podIf(sc *Scenario) string {
	if sc.Config.InterfacePrefix != "" {
		return sc.Config.InterfacePrefix + "0"
	}
	return defaultPod + "0"
}

// Send implements Backend.
func (b *SimBackend) Send(p packet.Packet, from Origin, _ *Expect) (*Observation, error) {
	if p.IIf == "" {
		switch from {
		case FromPod:
			p.IIf = podIf(b.sc)
		case FromRemotePod:
			p.IIf = clusterIf
		case FromExternal:
			p.IIf = uplinkIf
		}
	}
	// Each packet opens a new connection; affinity state (dynamic sets) carries over.
	b.rt.FlushConntrack()
	tr, err := b.rt.Trace(p)
	if err != nil {
		return nil, err
	}
	return observe(tr), nil
}

// observe reduces a trace to an Observation.
func observe(tr *sim.Trace) *Observation {
	obs := &Observation{Trace: tr.String()}
	verdicts := map[string]bool{}
	for _, br := range tr.Branches {
		o := br.Outcome
		verdicts[o.Verdict.String()] = true
		if o.Delivery == sim.DeliveryLocal {
			obs.Local = true
		}
		if o.Verdict == sim.VerdictAccept && o.DNAT {
			obs.DNAT = true
			obs.Endpoints = append(obs.Endpoints, o.Packet.Dst)
		}
		if o.Masquerade {
			obs.Masquerade = true
		}
		obs.Source = o.Packet.Src.Addr()
	}
	for v := range verdicts {
		if obs.Verdict != "" {
			obs.Verdict = "mixed"
			break
		}
		obs.Verdict = v
	}
	if tr.Committed >= 0 && tr.Committed < len(tr.Branches) {
		if o := tr.Branches[tr.Committed].Outcome; o.DNAT {
			obs.Chosen = o.Packet.Dst
		}
	}
	return obs
}

// Advance implements Backend.
func (b *SimBackend) Advance(d time.Duration) error {
	b.clock.Advance(d)
	return nil
}

// Close implements Backend.
func (b *SimBackend) Close() error { return nil }
