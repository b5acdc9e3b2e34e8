package kernel

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// observerTable is the node's table through which the Backend watches packets. It never
// changes a verdict, and it is never the proxier's table: it marks new connections for
// `nft monitor trace`, and counts the packets the node sends on into void0, the lab's
// route to nowhere.
const observerTable = "kernel-backend-observer"

// The observer's counters of TCP, UDP and SCTP packets leaving through void0 at the end of
// postrouting: all of them, those of DNATed connections, and those of masqueraded ones.
const (
	counterVoid     = "void"
	counterVoidDNAT = "void-dnat"
	counterVoidSNAT = "void-snat"
)

// voidCounts are the observer's counters at some moment.
type voidCounts struct{ all, dnat, snat uint64 }

// observer reads the observer table of a node.
type observer struct {
	nft  knftables.Interface
	last voidCounts
}

// newObserver loads the observer table into the node.
func newObserver(node *lab.NS) (*observer, error) {
	nft, err := lab.NFT(node, knftables.InetFamily, observerTable)
	if err != nil {
		return nil, err
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	for _, c := range []struct {
		name     string
		hook     knftables.BaseChainHook
		priority knftables.BaseChainPriority
	}{
		// After conntrack (-200), before the proxier's chains.
		{"prerouting", knftables.PreroutingHook, "-199"},
		{"output", knftables.OutputHook, "-199"},
		// After every NAT and filter chain of the proxier.
		{"postrouting", knftables.PostroutingHook, "500"},
	} {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(knftables.FilterType), Hook: &c.hook, Priority: &c.priority})
	}
	tx.Add(&knftables.Rule{Chain: "prerouting", Rule: "ct state new meta nftrace set 1"})
	tx.Add(&knftables.Rule{Chain: "output", Rule: "ct state new meta nftrace set 1"})
	for _, c := range []struct{ name, match string }{
		{counterVoid, ""},
		{counterVoidDNAT, "ct status dnat"},
		{counterVoidSNAT, "ct status snat"},
	} {
		tx.Add(&knftables.Counter{Name: c.name})
		tx.Add(&knftables.Rule{Chain: "postrouting", Rule: knftables.Concat(
			`oifname "void0" meta l4proto { tcp, udp, sctp }`, c.match, "counter name", c.name)})
	}
	if err := nft.Run(context.Background(), tx); err != nil {
		return nil, fmt.Errorf("netns %s: observer table: %w", node, err)
	}
	return &observer{nft: nft}, nil
}

// voided returns what reached void0 since the last call. Only connections that get no
// answer go there (pods and the node answer everything else), so the Backend calls it
// after each connection that timed out.
func (o *observer) voided() (voidCounts, error) {
	cs, err := o.nft.ListCounters(context.Background())
	if err != nil {
		return voidCounts{}, fmt.Errorf("observer counters: %w", err)
	}
	var now voidCounts
	for _, c := range cs {
		if c.Packets == nil {
			continue
		}
		switch c.Name {
		case counterVoid:
			now.all = *c.Packets
		case counterVoidDNAT:
			now.dnat = *c.Packets
		case counterVoidSNAT:
			now.snat = *c.Packets
		}
	}
	d := voidCounts{all: now.all - o.last.all, dnat: now.dnat - o.last.dnat, snat: now.snat - o.last.snat}
	o.last = now
	return d, nil
}
