package lab

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqPtr is struct ifreq carrying a pointer, as SIOCETHTOOL wants it.
type ifreqPtr struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

// syncLink asks the kernel for a link's carrier through ethtool (ETHTOOL_GLINK), which makes
// it process the link's pending linkwatch event, activating its transmit queue, now rather
// than within a second; run inside Do. It reports the carrier.
func syncLink(name string) (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	v := ethtoolValue{cmd: unix.ETHTOOL_GLINK}
	var ifr ifreqPtr
	copy(ifr.name[:unix.IFNAMSIZ-1], name)
	ifr.data = unsafe.Pointer(&v)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return false, errno
	}
	return v.data != 0, nil
}

// waitReady waits until the kernel has finished, asynchronously, what building the lab
// started; packets sent before are lost and cost a retransmission a second later:
//   - every veth whose both ends are up is operationally up: the kernel activates a link's
//     transmit queue (linkwatch) some time after its carrier comes up, and drops what is
//     sent before;
//   - every IPv6 address has its local route: even without DAD, the kernel installs it from
//     a work item that waits for the RTNL lock, which the teardown of earlier namespaces can
//     hold for long, and until then the address drops what it receives.
func (l *Lab) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, ns := range l.all {
		for {
			pending, err := l.pending(ns)
			if err != nil {
				return fmt.Errorf("netns %s: %w", ns.name, err)
			}
			if len(pending) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("netns %s: %v not ready after %v", ns.name, pending, timeout)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

// pending lists what is not ready yet in ns (see waitReady), and nudges links along.
func (l *Lab) pending(ns *NS) (pending []string, err error) {
	err = ns.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		for _, link := range links {
			a := link.Attrs()
			if link.Type() != "veth" || a.Flags&net.FlagUp == 0 || l.stubs[ns.name+"/"+a.Name] {
				continue
			}
			if a.OperState != netlink.OperUp {
				pending = append(pending, "link "+a.Name)
				if _, err := syncLink(a.Name); err != nil {
					return fmt.Errorf("link %s: ethtool: %w", a.Name, err)
				}
			}
		}
		local, err := netlink.RouteListFiltered(netlink.FAMILY_V6,
			&netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("list local routes: %w", err)
		}
		names := map[int]string{}
		for _, link := range links {
			names[link.Attrs().Index] = link.Attrs().Name
		}
		have := map[string]bool{}
		for _, r := range local {
			if r.Dst != nil && r.Type == unix.RTN_LOCAL {
				have[names[r.LinkIndex]+" "+r.Dst.IP.String()] = true
			}
		}
		for _, a := range l.addrs6 {
			if a.ns == ns && !have[a.link+" "+a.addr.String()] {
				pending = append(pending, fmt.Sprintf("address %v on %s", a.addr, a.link))
			}
		}
		return nil
	})
	return pending, err
}

// pairNeighbors makes the two ends of a veth know each other's addresses (aAddrs are a's,
// bAddrs b's) as permanent neighbors. Every lab link is point to point with addresses known
// in advance, so address resolution would add nothing but latency and a race: an IPv6 pod
// joins its solicited-node multicast group asynchronously after its address is added, and a
// neighbor solicitation arriving before that is lost and retried only after a second.
func pairNeighbors(a *NS, aLink string, aAddrs []netip.Addr, b *NS, bLink string, bAddrs []netip.Addr) error {
	aMAC, err := linkMAC(a, aLink)
	if err != nil {
		return err
	}
	bMAC, err := linkMAC(b, bLink)
	if err != nil {
		return err
	}
	if err := addNeighbors(a, aLink, bAddrs, bMAC); err != nil {
		return err
	}
	return addNeighbors(b, bLink, aAddrs, aMAC)
}

func linkMAC(ns *NS, link string) (mac net.HardwareAddr, err error) {
	err = ns.Do(func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		mac = l.Attrs().HardwareAddr
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("netns %s: link %s: %w", ns.name, link, err)
	}
	return mac, nil
}

func addNeighbors(ns *NS, link string, addrs []netip.Addr, mac net.HardwareAddr) error {
	return ns.Do(func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return fmt.Errorf("netns %s: link %s: %w", ns.name, link, err)
		}
		for _, a := range addrs {
			n := &netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT,
				IP: net.IP(a.AsSlice()), HardwareAddr: mac, Family: netlink.FAMILY_V4}
			if a.Is6() {
				n.Family = netlink.FAMILY_V6
			}
			if err := netlink.NeighSet(n); err != nil {
				return fmt.Errorf("netns %s: neighbor %v lladdr %v dev %s: %w", ns.name, a, mac, link, err)
			}
		}
		return nil
	})
}

// hosts returns the addresses of prefixes.
func hosts(ps []netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, len(ps))
	for i, p := range ps {
		out[i] = p.Addr()
	}
	return out
}

// addVeth creates a veth pair with one end in a and the other in b. The pair is made by a
// netlink socket of a, so it never exists in the namespace the process started in.
func addVeth(a *NS, aName string, b *NS, bName string) error {
	peer, err := netns.GetFromPath(filepath.Join(netnsDir, b.name))
	if err != nil {
		return fmt.Errorf("netns %s: open: %w", b.name, err)
	}
	defer peer.Close()
	err = a.Do(func() error {
		return netlink.LinkAdd(&netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: aName},
			PeerName:      bName,
			PeerNamespace: netlink.NsFd(int(peer)),
		})
	})
	if err != nil {
		return fmt.Errorf("netns %s: veth %s <-> %s/%s: %w", a.name, aName, b.name, bName, err)
	}
	return nil
}

// addStub creates, in ns, a veth name whose peer (also in ns) stays down: a link that
// transmits into nothing. Dummy links would do, but kernels may lack them; veths they have.
func (l *Lab) addStub(ns *NS, name, peer string, noARP bool) error {
	if l.stubs == nil {
		l.stubs = map[string]bool{}
	}
	l.stubs[ns.name+"/"+name] = true
	err := ns.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			return err
		}
		if !noARP {
			return nil
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkSetARPOff(l)
	})
	if err != nil {
		return fmt.Errorf("netns %s: stub link %s: %w", ns.name, name, err)
	}
	return nil
}

// addr6 is an IPv6 address of a link of a lab namespace.
type addr6 struct {
	ns   *NS
	link string
	addr netip.Addr
}

// configure brings a link up and gives it addresses, without DAD.
func (l *Lab) configure(ns *NS, link string, addrs []netip.Prefix) error {
	for _, a := range addrs {
		if a.Addr().Is6() {
			l.addrs6 = append(l.addrs6, addr6{ns, link, a.Addr()})
		}
	}
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("up: %w", err)
		}
		for _, a := range addrs {
			addr := &netlink.Addr{IPNet: prefixToIPNet(a)}
			if a.Addr().Is6() {
				addr.Flags = unix.IFA_F_NODAD
			}
			if err := netlink.AddrAdd(l, addr); err != nil {
				return fmt.Errorf("address %v: %w", a, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netns %s: link %s: %w", ns.name, link, err)
	}
	return nil
}

// defaultRoutes adds, in ns, a default route via link to the first gateway of each family.
func defaultRoutes(ns *NS, link string, gws []netip.Prefix) error {
	return ns.Do(func() error {
		for _, v6 := range []bool{false, true} {
			if gw := first(gws, v6); gw.IsValid() {
				if err := addRoute(ns.name, link, netip.Prefix{}, gw, false); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// voidDefaults adds default routes of both families into the dummy link void; run inside Do.
func voidDefaults(nsName, void string) error {
	for _, dst := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		if err := addRoute(nsName, void, dst, netip.Addr{}, false); err != nil {
			return err
		}
	}
	return nil
}

// addRoute adds a route to dst (a default route when dst is the zero Prefix; dst's family
// is then gw's) out of link, via gw when it is valid; run inside Do.
func addRoute(nsName, link string, dst netip.Prefix, gw netip.Addr, onlink bool) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return fmt.Errorf("netns %s: link %s: %w", nsName, link, err)
	}
	if !dst.IsValid() {
		dst = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if gw.Is6() {
			dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixToIPNet(dst)}
	if gw.IsValid() {
		r.Gw = net.IP(gw.AsSlice())
		if onlink {
			r.Flags = int(netlink.FLAG_ONLINK)
		}
	} else {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := netlink.RouteAdd(r); err != nil {
		return fmt.Errorf("netns %s: route %v via %v dev %s: %w", nsName, dst, gw, link, err)
	}
	return nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
