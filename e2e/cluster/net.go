package cluster

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// bridgeName is the bridge of the segment namespace, the L2 segment every node and the
// control plane are plugged into.
const bridgeName = "br0"

// routerSysctls make a node namespace forward, and answer rejects without rate limit.
var routerSysctls = [][2]string{
	{"net.ipv4.ip_forward", "1"},
	{"net.ipv4.icmp_ratelimit", "0"},
	{"net.ipv4.conf.all.rp_filter", "0"},
	{"net.ipv4.conf.default.rp_filter", "0"},
}

// addVeth creates a veth pair: aName inside a, bName inside b, both up.
func addVeth(a *lab.NS, aName string, b *lab.NS, bName string) error {
	f, err := os.Open(filepath.Join("/run/netns", b.Name()))
	if err != nil {
		return fmt.Errorf("veth %s/%s-%s/%s: %w", a, aName, b, bName, err)
	}
	defer f.Close()
	err = a.Do(func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: bName,
			PeerNamespace: netlink.NsFd(int(f.Fd()))}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		return linkUp(aName)
	})
	if err == nil {
		err = b.Do(func() error { return linkUp(bName) })
	}
	if err != nil {
		return fmt.Errorf("veth %s/%s-%s/%s: %w", a, aName, b, bName, err)
	}
	return nil
}

// linkUp sets a link of the calling thread's namespace up.
func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("link %s up: %w", name, err)
	}
	return nil
}

// newSegment creates the bridge of the segment namespace.
func newSegment(seg *lab.NS) error {
	return seg.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}); err != nil {
			return fmt.Errorf("netns %s: bridge %s: %w", seg, bridgeName, err)
		}
		return linkUp(bridgeName)
	})
}

// plug connects ns to the segment with its link eth0 holding addr; port is the name of
// the bridge port in the segment namespace.
func plug(seg *lab.NS, port string, ns *lab.NS, addr netip.Prefix) error {
	if err := addVeth(seg, port, ns, "eth0"); err != nil {
		return err
	}
	err := seg.Do(func() error {
		br, err := netlink.LinkByName(bridgeName)
		if err != nil {
			return err
		}
		p, err := netlink.LinkByName(port)
		if err != nil {
			return err
		}
		return netlink.LinkSetMaster(p, br)
	})
	if err != nil {
		return fmt.Errorf("netns %s: attach %s to %s: %w", seg, port, bridgeName, err)
	}
	return addAddr(ns, "eth0", addr)
}

// addAddr adds addr to a link of ns. An IPv6 address skips duplicate address detection,
// which would keep it unusable for a second: the lab knows its addresses are unique.
func addAddr(ns *lab.NS, link string, addr netip.Prefix) error {
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		a := &netlink.Addr{IPNet: ipNet(addr)}
		if addr.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		return netlink.AddrAdd(l, a)
	})
	if err != nil {
		return fmt.Errorf("netns %s: address %s on %s: %w", ns, addr, link, err)
	}
	return nil
}

// addRoute adds a route to dst in ns: through link, via gw unless gw is the zero Addr
// (then dst is on link). A zero dst is the default route.
func addRoute(ns *lab.NS, link string, dst netip.Prefix, gw netip.Addr) error {
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK}
		if dst.IsValid() {
			r.Dst = ipNet(dst)
		}
		if gw.IsValid() {
			r.Gw, r.Scope = net.IP(gw.AsSlice()), netlink.SCOPE_UNIVERSE
			r.Flags = int(netlink.FLAG_ONLINK)
		}
		return netlink.RouteAdd(r)
	})
	if err != nil {
		return fmt.Errorf("netns %s: route %s via %s dev %s: %w", ns, dst, gw, link, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
