package kernel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// DefaultTimeout bounds each connection a Backend makes when its Timeout is zero. A
// connection that gets no answer within it counts as dropped.
const DefaultTimeout = time.Second

// MaxSleep is the longest scenario advance the Backend lives through in real time.
// Longer ones are skipped: see Advance.
const MaxSleep = 6 * time.Second

// Backend is the features.Backend of the real kernel. Start builds a throw-away lab of
// network namespaces from the scenario (see Derive) and syncs the production ruleset into
// the lab's node through the production syncer and the real nft; Send opens real
// connections from the namespace that owns the packet's source and reports who answered
// and what they saw. It needs root (see Available).
type Backend struct {
	// Timeout bounds each connection; zero means DefaultTimeout.
	Timeout time.Duration
	// NoTrace turns off the `nft monitor trace` whose lines go into each Observation.
	NoTrace bool

	sc   *features.Scenario
	topo *Topology
	lab  *lab.Lab
	// nfts are the node's tables the Proxier opened.
	nfts map[knftables.Family]knftables.Interface
	// transports are the node's netlink transports, whose sockets hold its namespace
	// until closed.
	transports []syncer.Transport
	// fresh is the namespace of the fresh full builds the node's tables are
	// compared with (see FreshTable), freshNFT its tables.
	fresh    *lab.NS
	freshNFT map[knftables.Family]knftables.Interface
	st       *state.ClusterState
	resp     *lab.EchoServer
	obs      *observer
	trace    *lab.Trace
	// behind is how far the scenario's clock ran ahead of the kernel's through advances
	// the Backend skipped.
	behind time.Duration
	closed bool
}

var _ features.Backend = (*Backend)(nil)

// New returns a kernel backend; it does nothing until Start.
func New() *Backend { return &Backend{} }

// Available reports why the kernel backend cannot run here, or nil when it can: it
// needs root (namespaces, veths, nftables) and the nft binary.
func Available() error {
	if err := lab.Usable(); err != nil {
		return fmt.Errorf("kernel backend: %w", err)
	}
	return nil
}

// Name returns "kernel".
func (b *Backend) Name() string { return "kernel" }

// Topology returns the topology of the running scenario, nil before Start.
func (b *Backend) Topology() *Topology { return b.topo }

// Lab returns the running lab, nil before Start.
func (b *Backend) Lab() *lab.Lab { return b.lab }

// Start implements features.Backend: it derives and builds the lab, routes answers to
// remote-pod clients through the node, starts the node's responder, loads the observer
// table and starts the trace, and makes the namespace of the fresh builds. The node's
// tables are the kernel's in the lab's node namespace, listed and written through nft
// and elements written over netlink, as DefaultNewNFT and KernelNetlink do in the
// daemon. On failure everything built is removed again.
func (b *Backend) Start(sc *features.Scenario) (_ features.Tables, err error) {
	if b.sc != nil {
		return features.Tables{}, fmt.Errorf("kernel backend: scenario %s: started twice", sc.File)
	}
	b.sc = sc
	if b.topo, err = Derive(sc); err != nil {
		return features.Tables{}, fmt.Errorf("kernel backend: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("kernel backend: scenario %s: %w", sc.File, err), b.Close())
		}
	}()
	if b.lab, err = lab.New(b.topo.Spec); err != nil {
		return features.Tables{}, err
	}
	if err := b.routeRemoteSources(); err != nil {
		return features.Tables{}, err
	}
	if b.resp, err = startResponder(b.lab.Node, b.topo.LocalAddrs, b.topo.LocalPorts); err != nil {
		return features.Tables{}, err
	}
	if err := b.startObserver(); err != nil {
		return features.Tables{}, err
	}
	if b.fresh, err = lab.NewNS(lab.NamePrefix + b.lab.ID + "-fresh"); err != nil {
		return features.Tables{}, err
	}
	b.freshNFT = map[knftables.Family]knftables.Interface{}
	b.nfts = map[knftables.Family]knftables.Interface{}
	node := b.lab.Node
	return features.Tables{
		NewNFT: func(fam knftables.Family, table string) (knftables.Interface, error) {
			nft, err := lab.NFT(node, fam, table, knftables.UseNetlink)
			b.nfts[fam] = nft
			return nft, err
		},
		Netlink: func(knftables.Family, knftables.Interface) syncer.Transport {
			t := syncer.KernelNetlink(node.Do)
			b.transports = append(b.transports, t)
			return t
		},
	}, nil
}

// remoteSourceTable is the remote node's routing table for answers to remote-pod clients.
const remoteSourceTable = 100

// routeRemoteSources makes the remote node route traffic to remote-pod clients from its
// other pods through the node (see Topology.RemoteSources), and turns off reverse-path
// filtering there: the node forwards DNATed packets from those clients back to it.
func (b *Backend) routeRemoteSources() error {
	if len(b.topo.RemoteSources) == 0 {
		return nil
	}
	r := b.lab.Remote
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.eth0.rp_filter"} {
		if err := r.SetSysctl(k, "0"); err != nil {
			return err
		}
	}
	err := r.Do(func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("link eth0: %w", err)
		}
		for _, gw := range b.topo.Spec.Remote.NodeAddrs {
			fam, dflt := netlink.FAMILY_V4, netip.MustParsePrefix("0.0.0.0/0")
			if gw.Addr().Is6() {
				fam, dflt = netlink.FAMILY_V6, netip.MustParsePrefix("::/0")
			}
			// What comes back from the node is delivered as usual.
			back := netlink.NewRule()
			back.Family, back.Priority, back.IifName, back.Table = fam, 100, "eth0", unix.RT_TABLE_MAIN
			if err := netlink.RuleAdd(back); err != nil {
				return fmt.Errorf("rule iif eth0 lookup main: %w", err)
			}
			rt := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(dflt), Gw: net.IP(gw.Addr().AsSlice()), Table: remoteSourceTable}
			if err := netlink.RouteAdd(rt); err != nil {
				return fmt.Errorf("route default via %s table %d: %w", gw.Addr(), remoteSourceTable, err)
			}
		}
		for _, a := range b.topo.RemoteSources {
			rule := netlink.NewRule()
			rule.Family, rule.Priority, rule.Table = netlink.FAMILY_V4, 110, remoteSourceTable
			if a.Is6() {
				rule.Family = netlink.FAMILY_V6
			}
			rule.Dst = ipNet(netip.PrefixFrom(a, a.BitLen()))
			if err := netlink.RuleAdd(rule); err != nil {
				return fmt.Errorf("rule to %s lookup %d: %w", a, remoteSourceTable, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netns %s: %w", r, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// startObserver loads the observer table into the node and, unless tracing is off or
// stdbuf (which the lab's trace needs) is missing, starts `nft monitor trace` there.
func (b *Backend) startObserver() error {
	var err error
	if b.obs, err = newObserver(b.lab.Node); err != nil {
		return err
	}
	if b.NoTrace {
		return nil
	}
	if _, err := exec.LookPath("stdbuf"); err != nil {
		b.NoTrace = true
		return nil
	}
	b.trace, err = b.lab.Node.StartTrace()
	return err
}

// Synced implements features.Backend: the kernel serves what the Proxier wrote as
// soon as it is written; the Backend only notes the state, for Send.
func (b *Backend) Synced(st *state.ClusterState, _ []features.FamilySync) error {
	b.st = st
	return nil
}

// Table implements features.Backend: the node's table as nft lists it.
func (b *Backend) Table(fam knftables.Family) (*features.TableView, error) {
	if b.lab == nil {
		return nil, errors.New("kernel backend: Table before Start")
	}
	return readTable(b.lab.Node, fam, b.sc.Config.Table)
}

// FreshTable implements features.Backend: want is written by a new Syncer through
// nft alone into the fresh-build namespace, which no packet crosses.
func (b *Backend) FreshTable(want *ruleset.Ruleset) (*features.TableView, error) {
	if b.fresh == nil {
		return nil, errors.New("kernel backend: FreshTable before Start")
	}
	nft := b.freshNFT[want.Family]
	if nft == nil {
		var err error
		if nft, err = lab.NFT(b.fresh, want.Family, want.Table); err != nil {
			return nil, err
		}
		b.freshNFT[want.Family] = nft
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := syncer.New(nft).Sync(ctx, want); err != nil {
		return nil, fmt.Errorf("kernel backend: fresh build of table %s %s in netns %s: %w", want.Family, want.Table, b.fresh, err)
	}
	return readTable(b.fresh, want.Family, want.Table)
}

// Advance implements features.Backend. The lab runs on the real clock: an advance of up
// to MaxSleep is slept through; a longer one is skipped with an error wrapping
// features.ErrUnsupported, and from then on Send skips packets to frontends of Services
// with session affinity, whose timeouts the kernel measures on its own clock.
func (b *Backend) Advance(d time.Duration) error {
	if d <= MaxSleep {
		time.Sleep(d)
		return nil
	}
	b.behind += d
	return fmt.Errorf("kernel backend: advance %v: the lab runs on the real clock and sleeps through at most %v: %w",
		d, MaxSleep, features.ErrUnsupported)
}

// Close implements features.Backend: it stops the responder and the trace, removes the
// lab and fails when the lab left anything behind. It is idempotent.
func (b *Backend) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	var errs []error
	if b.resp != nil {
		errs = append(errs, b.resp.Stop())
	}
	if b.trace != nil {
		_, err := b.trace.Stop()
		errs = append(errs, err)
	}
	for _, t := range b.transports {
		if c, ok := t.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	if b.fresh != nil {
		errs = append(errs, b.fresh.Close())
	}
	if b.lab != nil {
		errs = append(errs, b.lab.Close())
		leaks, err := b.lab.Leaks()
		errs = append(errs, err)
		if len(leaks) > 0 {
			errs = append(errs, fmt.Errorf("kernel backend: lab %s left behind: %s", b.lab.ID, strings.Join(leaks, "; ")))
		}
	}
	return errors.Join(errs...)
}
