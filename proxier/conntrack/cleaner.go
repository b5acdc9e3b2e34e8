package conntrack

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Cleaner deletes conntrack entries in the current network namespace.
type Cleaner struct {
	// deleteFilters is netlink.ConntrackDeleteFilters, replaceable in tests.
	deleteFilters func(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error)
}

// NewCleaner returns a Cleaner that talks netlink to the kernel.
func NewCleaner() *Cleaner {
	return &Cleaner{deleteFilters: netlink.ConntrackDeleteFilters}
}

// Clear deletes the entries selected by filters and returns how many it deleted.
// Each family's table is read once, whatever the number of filters.
func (c *Cleaner) Clear(filters []Filter) (uint, error) {
	byFamily := map[netlink.InetFamily]index{}
	for _, f := range filters {
		fam := netlink.InetFamily(unix.AF_INET)
		if f.OrigDst.Addr().Is6() {
			fam = unix.AF_INET6
		}
		if byFamily[fam] == nil {
			byFamily[fam] = index{}
		}
		byFamily[fam][f.OrigDst] = append(byFamily[fam][f.OrigDst], f)
	}
	var total uint
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		idx := byFamily[fam]
		if idx == nil {
			continue
		}
		n, err := c.deleteFilters(netlink.ConntrackTable, fam, idx)
		total += n
		if err != nil {
			return total, fmt.Errorf("deleting stale conntrack entries (family %d, %d filters): %w", fam, len(filters), err)
		}
	}
	return total, nil
}

// index is a set of filters keyed by original destination, so that matching a flow
// costs one map look-up however many filters there are.
type index map[frontend][]Filter

// MatchConntrackFlow reports whether some filter of the index selects flow.
func (x index) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	for _, f := range x[addrPort(flow.Forward.DstIP, flow.Forward.DstPort)] {
		if f.MatchConntrackFlow(flow) {
			return true
		}
	}
	return false
}
