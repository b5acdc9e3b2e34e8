package kernel

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// planner chooses the subnets of the lab's links. Scenarios give bare addresses; the lab
// wants each on a subnet shared with its peer, and no subnet may capture an address that
// lives elsewhere (a VIP, a pod, another client), or the lab's own routing would send
// traffic for it to the wrong link.
type planner struct {
	all   []netip.Addr        // every address of the scenario
	used  map[netip.Addr]bool // those and every address the plan added
	taken []netip.Prefix      // eth1 subnets: no other address may lie in them
}

// planSubnets fills in the Spec's node, client and remote addresses.
func (t *Topology) planSubnets(sc *features.Scenario, inv *inventory, clients []netip.Addr) error {
	pl := &planner{all: inv.order, used: map[netip.Addr]bool{}}
	for _, a := range inv.order {
		pl.used[a] = true
	}
	isNode := map[netip.Addr]bool{}
	for _, a := range sc.Node.Addresses {
		isNode[a] = true
	}
	isClient := map[netip.Addr]bool{}
	for _, a := range clients {
		isClient[a] = true
	}

	// The node's own addresses on eth0, in scenario order: the first of each family is
	// what the kernel picks for masquerading out of pod interfaces, as in the simulator.
	var nodePrefixes []netip.Prefix
	for _, a := range sc.Node.Addresses {
		if q, ok := within(nodePrefixes, a); ok {
			nodePrefixes = append(nodePrefixes, netip.PrefixFrom(a, q.Bits()))
			continue
		}
		p, ok := choose(a, wideFirst(a), func(q netip.Prefix) bool {
			return !pl.captures(q, func(b netip.Addr) bool { return isNode[b] || isClient[b] })
		})
		if !ok {
			return fmt.Errorf("node address %s: every subnet around it holds other addresses of the scenario", a)
		}
		nodePrefixes = append(nodePrefixes, p)
	}

	// eth1 carries the node's first address of each family too, so that traffic
	// masqueraded towards the remote node shows the same address as towards local pods.
	if r := t.Spec.Remote; r != nil {
		for _, v6 := range []bool{false, true} {
			a := firstOf(sc.Node.Addresses, v6)
			if !a.IsValid() {
				continue
			}
			var remote netip.Addr
			p, ok := choose(a, narrowFirst(a), func(q netip.Prefix) bool {
				if pl.captures(q, func(b netip.Addr) bool { return b == a }) {
					return false
				}
				var found bool
				remote, found = pickHost(q, pl.free)
				return found
			})
			if !ok {
				return fmt.Errorf("node address %s: no subnet around it leaves room for the remote node", a)
			}
			pl.used[remote] = true
			pl.taken = append(pl.taken, p.Masked())
			r.NodeAddrs = append(r.NodeAddrs, p)
			r.Addrs = append(r.Addrs, netip.PrefixFrom(remote, p.Bits()))
		}
	}

	// The external client: each address in a node subnet or in a subnet of its own where
	// the node has a helper address, plus an address in the node's first subnet of each
	// family, through which its default route goes.
	var helpers []netip.Prefix
	if len(clients) > 0 {
		c := &lab.ClientSpec{}
		for _, a := range clients {
			if q, ok := within(append(slices.Clone(nodePrefixes), helpers...), a); ok {
				c.Addrs = append(c.Addrs, netip.PrefixFrom(a, q.Bits()))
				continue
			}
			var helper netip.Addr
			p, ok := choose(a, wideFirst(a), func(q netip.Prefix) bool {
				if pl.captures(q, func(b netip.Addr) bool { return isClient[b] }) ||
					overlapsAny(q, nodePrefixes) || overlapsAny(q, helpers) || overlapsAny(q, pl.taken) {
					return false
				}
				var found bool
				helper, found = pickHost(q, pl.free)
				return found
			})
			if !ok {
				return fmt.Errorf("external client %s: every subnet around it holds other addresses of the scenario", a)
			}
			pl.used[helper] = true
			helpers = append(helpers, netip.PrefixFrom(helper, p.Bits()))
			c.Addrs = append(c.Addrs, p)
		}
		for _, v6 := range []bool{false, true} {
			q, ok := firstPrefixOf(nodePrefixes, v6)
			if !ok {
				continue
			}
			if _, ok := within(c.Addrs, q.Addr()); ok {
				continue // a client address already shares the node's first subnet
			}
			gw, ok := pickHost(q.Masked(), pl.free)
			if !ok {
				return fmt.Errorf("node subnet %s: no free address left for the external client's gateway link", q.Masked())
			}
			pl.used[gw] = true
			c.Addrs = append(c.Addrs, netip.PrefixFrom(gw, q.Bits()))
		}
		t.Spec.Client = c
	}
	t.Spec.NodeAddrs = append(nodePrefixes, helpers...)
	return nil
}

// captures reports whether subnet q holds an address of the scenario for which allowed
// is false.
func (pl *planner) captures(q netip.Prefix, allowed func(netip.Addr) bool) bool {
	for _, b := range pl.all {
		if q.Contains(b) && !allowed(b) {
			return true
		}
	}
	return false
}

// free reports whether a is neither an address of the scenario, nor one the plan used,
// nor inside an eth1 subnet.
func (pl *planner) free(a netip.Addr) bool {
	return !pl.used[a] && !containedIn(pl.taken, a)
}

// wideFirst lists the subnet lengths for a link to a client: /24 to /30, /64 to /126.
func wideFirst(a netip.Addr) []int {
	if a.Is4() {
		return lengths(24, 30)
	}
	return lengths(64, 126)
}

// narrowFirst lists the subnet lengths for the point-to-point link to the remote node:
// /30 to /16, /126 to /48.
func narrowFirst(a netip.Addr) []int {
	if a.Is4() {
		return lengths(30, 16)
	}
	return lengths(126, 48)
}

func lengths(from, to int) []int {
	var out []int
	for b := from; ; {
		out = append(out, b)
		if b == to {
			return out
		}
		if from < to {
			b++
		} else {
			b--
		}
	}
}

// choose returns the first subnet of a, in the given lengths, in which a is a usable host
// address and that fits.
func choose(a netip.Addr, bits []int, fits func(netip.Prefix) bool) (netip.Prefix, bool) {
	for _, b := range bits {
		q := netip.PrefixFrom(a, b).Masked()
		if isHost(q, a) && fits(q) {
			return netip.PrefixFrom(a, b), true
		}
	}
	return netip.Prefix{}, false
}

// isHost reports whether a is an address of subnet q that a host may have: neither the
// network address nor, in IPv4, the broadcast address.
func isHost(q netip.Prefix, a netip.Addr) bool {
	q = q.Masked()
	return q.Contains(a) && a != q.Addr() && (a.Is6() || a != lastAddr(q))
}

// pickHost returns the highest host address of q that ok accepts, trying a few.
func pickHost(q netip.Prefix, ok func(netip.Addr) bool) (netip.Addr, bool) {
	q = q.Masked()
	a := lastAddr(q)
	for range 256 {
		a = a.Prev()
		if !isHost(q, a) {
			break
		}
		if ok(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// lastAddr returns the last address of q (the broadcast address of an IPv4 subnet).
func lastAddr(q netip.Prefix) netip.Addr {
	b := q.Masked().Addr().AsSlice()
	host := len(b)*8 - q.Bits()
	for i := len(b) - 1; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// within returns the prefix of ps (as a subnet) in which a is a host address.
func within(ps []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, p := range ps {
		if isHost(p, a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

func containedIn(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Masked().Contains(a) {
			return true
		}
	}
	return false
}

func overlapsAny(q netip.Prefix, ps []netip.Prefix) bool {
	for _, p := range ps {
		if q.Overlaps(p.Masked()) {
			return true
		}
	}
	return false
}

func firstOf(as []netip.Addr, v6 bool) netip.Addr {
	for _, a := range as {
		if a.Is6() == v6 {
			return a
		}
	}
	return netip.Addr{}
}

func firstPrefixOf(ps []netip.Prefix, v6 bool) (netip.Prefix, bool) {
	for _, p := range ps {
		if p.Addr().Is6() == v6 {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// sortedServiceNames returns the keys of m in namespace/name order.
func sortedServiceNames[V any](m map[state.ServiceName]V) []state.ServiceName {
	return slices.SortedFunc(maps.Keys(m), func(a, b state.ServiceName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
}
