package features

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/packet"
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

// SimBackend runs scenarios on the simulator: the Proxier writes knftables.Fake
// tables, its netlink batches decoded back into operations on the same Fakes
// (syncer.DecodedNetlink), and the simulator compiles the tables and traces
// packets through them.
type SimBackend struct {
	sc    *Scenario
	fakes map[knftables.Family]*knftables.Fake
	clock *sim.ManualClock
	rt    *sim.Runtime
}

// NewSimBackend returns a simulator backend.
func NewSimBackend() *SimBackend { return &SimBackend{} }

// Name returns "sim".
func (b *SimBackend) Name() string { return "sim" }

// Start implements Backend.
func (b *SimBackend) Start(sc *Scenario) (Tables, error) {
	b.sc = sc
	b.clock = sim.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b.fakes = map[knftables.Family]*knftables.Fake{}
	return Tables{
		NewNFT: func(fam knftables.Family, table string) (knftables.Interface, error) {
			b.fakes[fam] = knftables.NewFake(fam, table)
			return b.fakes[fam], nil
		},
		Netlink: func(_ knftables.Family, nft knftables.Interface) syncer.Transport {
			return syncer.DecodedNetlink(nft)
		},
	}, nil
}

// Synced implements Backend: the simulator compiles the synced tables. Its runtime
// is kept across syncs, as the kernel keeps its affinity sets, and makes the
// affinity record moves the syncs made in the kernel: the simulator's records
// live in its runtime, not in the Fakes.
func (b *SimBackend) Synced(_ *state.ClusterState, syncs []FamilySync) error {
	prog, err := sim.CompileText(b.Ruleset())
	if err != nil {
		return fmt.Errorf("compiling the synced ruleset: %w", err)
	}
	if b.rt == nil {
		b.rt = sim.NewRuntime(prog, b.env())
		return nil
	}
	// Records are taken out before the new ruleset is loaded (it may drop the set
	// they are in), and put back after.
	type put struct {
		table, set string
		taken      *sim.Taken
		timeout    time.Duration
	}
	var puts []put
	for _, s := range syncs {
		nodeIPs := s.Applied.NodePortIPs()
		table := string(s.Family) + " " + s.Applied.Table
		for _, mv := range s.Result.AffinityMoves {
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

// Table implements Backend.
func (b *SimBackend) Table(fam knftables.Family) (*TableView, error) {
	return ReadTable(context.Background(), b.fakes[fam])
}

// FreshTable implements Backend.
func (b *SimBackend) FreshTable(want *ruleset.Ruleset) (*TableView, error) {
	ctx := context.Background()
	f := knftables.NewFake(want.Family, want.Table)
	if _, err := syncer.New(f).Sync(ctx, want); err != nil {
		return nil, err
	}
	return ReadTable(ctx, f)
}

// Ruleset returns the synced tables as nft text.
func (b *SimBackend) Ruleset() string {
	var dumps []string
	for _, fam := range families {
		if f := b.fakes[fam]; f != nil {
			dumps = append(dumps, f.Dump())
		}
	}
	return strings.Join(dumps, "")
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
