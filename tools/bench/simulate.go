package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/sim"
)

// SimResult is the simulator's cost at one N: compiling our ruleset once, then
// tracing a pod's packet to a ClusterIP with endpointsPerService endpoints.
type SimResult struct {
	N          int     `json:"n"`
	CompileS   float64 `json:"compile_s"`
	Traces     int     `json:"traces"`
	Branches   int     `json:"branches"`
	NsPerTrace Summary `json:"ns_per_trace"`
}

// simSubject is a compiled ruleset and the packet traced through it.
type simSubject struct {
	n    int
	prog *sim.Program
	pkt  packet.Packet
	env  sim.Env
	ns   []float64
	res  SimResult
}

// compileSim builds our ruleset for n Services and compiles the transaction text a
// full sync sends to `nft -f` (what the proxier would send). It does not go through
// knftables.Fake, whose element lookup is linear: loading 10k Services into a Fake
// takes minutes.
func compileSim(n int) (*simSubject, error) {
	c := newCluster(n)
	cfg := rulesetConfig()
	tx := knftables.NewFake(knftables.IPv4Family, cfg.Table).NewTransaction()
	ruleset.Build(c.state, cfg, knftables.IPv4Family).AddTo(tx)
	text := tx.String()
	t0 := time.Now()
	prog, err := sim.CompileText(text)
	if err != nil {
		return nil, fmt.Errorf("simulator N=%d: compile: %w", n, err)
	}
	s := &simSubject{n: n, prog: prog, res: SimResult{N: n, CompileS: time.Since(t0).Seconds()}}
	// A plain ClusterIP Service in the middle of the cluster.
	i := n / 2
	for typ, _, aff, _ := kindOf(i); typ != state.TypeClusterIP || aff || protocolOf(i) != state.TCP; typ, _, aff, _ = kindOf(i) {
		i++
	}
	s.pkt = packet.Packet{
		Protocol: packet.TCP,
		Src:      netip.AddrPortFrom(nthAddr(firstEndpoint, 3), 40000),
		Dst:      netip.AddrPortFrom(nthAddr(firstClusterIP, i), servicePort),
		IIf:      "veth0",
	}
	s.env = sim.Env{LocalAddrs: []netip.Addr{nodeAddr.Addr()}}
	tr, err := prog.Trace(s.pkt, s.env)
	if err != nil {
		return nil, fmt.Errorf("simulator N=%d: trace %s: %w", n, s.pkt, err)
	}
	s.res.Branches = len(tr.Branches)
	if len(tr.Branches) != endpointsPerService || !tr.Branches[0].Outcome.DNAT {
		return nil, fmt.Errorf("simulator N=%d: trace %s: want %d DNAT branches, got:\n%s", n, s.pkt, endpointsPerService, tr)
	}
	return s, nil
}

// measureSim traces each subject's packet in turns for about d, timing each trace,
// so that both sizes run under the same machine load and garbage-collector pace.
func measureSim(ctx context.Context, subjects []*simSubject, d time.Duration) ([]SimResult, error) {
	deadline := time.Now().Add(d)
	for round := 0; time.Now().Before(deadline) && ctx.Err() == nil; round++ {
		for i := range subjects {
			s := subjects[(i+round)%len(subjects)]
			for range 100 {
				t0 := time.Now()
				if _, err := s.prog.Trace(s.pkt, s.env); err != nil {
					return nil, fmt.Errorf("simulator N=%d: %w", s.n, err)
				}
				s.ns = append(s.ns, float64(time.Since(t0).Nanoseconds()))
			}
		}
	}
	var out []SimResult
	for _, s := range subjects {
		s.res.Traces = len(s.ns)
		s.res.NsPerTrace = summarize(s.ns)
		out = append(out, s.res)
	}
	return out, ctx.Err()
}
