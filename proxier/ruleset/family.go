package ruleset

import (
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// familyInfo holds the words that differ between the ip and ip6 tables, and decides
// which addresses belong to the family being built.
type familyInfo struct {
	// ip is the payload protocol keyword: "ip" or "ip6".
	ip string
	// addrType is the set element type of an address: "ipv4_addr" or "ipv6_addr".
	addrType string
	v6       bool
}

// newFamilyInfo returns the familyInfo of ip6 for knftables.IPv6Family, else of ip.
func newFamilyInfo(family knftables.Family) familyInfo {
	if family == knftables.IPv6Family {
		return familyInfo{ip: "ip6", addrType: "ipv6_addr", v6: true}
	}
	return familyInfo{ip: "ip", addrType: "ipv4_addr"}
}

// has reports whether a belongs to the family. IPv4-mapped IPv6 addresses count as
// IPv4, since that is what goes on the wire.
func (f familyInfo) has(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && a.Is6() == f.v6
}

// hasPrefix reports whether p is a valid prefix of the family.
func (f familyInfo) hasPrefix(p netip.Prefix) bool {
	return p.IsValid() && p.Addr().Is6() == f.v6 && !p.Addr().Is4In6()
}

// addrs returns the addresses of the family in as, unmapped, without zones and
// without duplicates, in their original order.
func (f familyInfo) addrs(as []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		a = a.Unmap().WithZone("")
		if f.has(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// prefixes returns the prefixes of the family in ps, masked, sorted and without the
// ones another prefix already covers, so that an anonymous interval set built from
// them never holds overlapping intervals (which some nft versions reject).
func (f familyInfo) prefixes(ps []netip.Prefix) []netip.Prefix {
	var in []netip.Prefix
	for _, p := range ps {
		if f.hasPrefix(p) {
			in = append(in, p.Masked())
		}
	}
	slices.SortFunc(in, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []netip.Prefix
	for _, p := range in {
		if len(out) > 0 && out[len(out)-1].Contains(p.Addr()) && out[len(out)-1].Bits() <= p.Bits() {
			continue
		}
		out = append(out, p)
	}
	return out
}

// addrString spells an address for nft.
func addrString(a netip.Addr) string { return a.Unmap().WithZone("").String() }

// prefixString spells a prefix for nft, as a bare address when it holds one address.
func prefixString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return addrString(p.Addr())
	}
	return p.String()
}

// prefixMatch returns the right-hand side of a match against ps: the prefix itself,
// or an anonymous set of them.
func prefixMatch(ps []netip.Prefix) string {
	if len(ps) == 1 {
		return prefixString(ps[0])
	}
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = prefixString(p)
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}
