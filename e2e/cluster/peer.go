package cluster

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/nftproxy/nftproxy/sim"
)

// Tracing a node's live ruleset with the simulator, as `nftrace --live` does inside the
// node: what the peer conformance suite compares between an nftproxy node and a
// kube-proxy node.

// LiveProgram dumps the node's live ruleset (`nft list ruleset` inside its namespace) and
// compiles it with forks, as nftrace --live does: whatever proxy programmed it, and
// whatever else a packet cannot decide, traces instead of failing. It returns the text
// too, for messages.
func (n *Node) LiveProgram(ctx context.Context) (*sim.Program, string, error) {
	text, err := n.Ruleset(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("node %s: %w", n.Spec.Name, err)
	}
	prog, err := sim.CompileTextOptions(text, sim.CompileOptions{Forks: true})
	if err != nil {
		return nil, text, fmt.Errorf("node %s (%s): live ruleset: %w", n.Spec.Name, n.Spec.Proxy, err)
	}
	return prog, text, nil
}

// StatelessRuleset returns `nft --stateless list ruleset` inside the node: the ruleset
// without counters and without the time left to the elements of sets with timeouts
// (session affinity), which count down and so never settle.
func (n *Node) StatelessRuleset(ctx context.Context) (string, error) {
	text, err := n.Exec(ctx, "", "nft", "--stateless", "list", "ruleset")
	if err != nil {
		return "", fmt.Errorf("node %s: %w", n.Spec.Name, err)
	}
	return text, nil
}

// SimEnv returns the node as the simulator needs it for a routing decision: its
// addresses, its segment address first (the one masquerade picks without a route's
// source), and its IPv4 and IPv6 routes with their devices and preferred sources, read
// from its namespace.
func (n *Node) SimEnv() (sim.Env, error) {
	env := sim.Env{LocalAddrs: []netip.Addr{n.Addr}}
	err := n.Do(func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("addresses: %w", err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() != n.Addr {
				env.LocalAddrs = append(env.LocalAddrs, ip.Unmap())
			}
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("routes: %w", err)
		}
		for _, r := range routes {
			route, err := simRoute(r)
			if err != nil {
				return err
			}
			env.Routes = append(env.Routes, route)
		}
		return nil
	})
	if err != nil {
		return sim.Env{}, fmt.Errorf("node %s: %w", n.Spec.Name, err)
	}
	return env, nil
}

// simRoute converts a route of the calling thread's namespace; a route without a
// destination is its family's default route.
func simRoute(r netlink.Route) (sim.Route, error) {
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return sim.Route{}, fmt.Errorf("route %s: link %d: %w", r.Dst, r.LinkIndex, err)
	}
	out := sim.Route{Dev: link.Attrs().Name}
	if src, ok := netip.AddrFromSlice(r.Src); ok {
		out.Src = src.Unmap()
	}
	switch {
	case r.Dst != nil:
		ip, _ := netip.AddrFromSlice(r.Dst.IP)
		bits, _ := r.Dst.Mask.Size()
		out.Prefix = netip.PrefixFrom(ip.Unmap(), bits)
	case r.Family == netlink.FAMILY_V6:
		out.Prefix = netip.MustParsePrefix("::/0")
	default:
		out.Prefix = netip.MustParsePrefix("0.0.0.0/0")
	}
	return out, nil
}
