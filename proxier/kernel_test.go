package proxier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/internal/testenv"
	"github.com/nftproxy/nftproxy/proxier/conntrack"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// netnsEnv, set to 1, makes the test binary run inNetns instead of the tests. Only
// TestKernelSyncAndConntrack sets it, on a child it starts under `unshare --net`.
const netnsEnv = "NFTPROXY_PROXIER_IN_NETNS"

func TestMain(m *testing.M) {
	if os.Getenv(netnsEnv) == "1" {
		if err := inNetns(); err != nil {
			fmt.Fprintln(os.Stderr, "in netns:", err)
			os.Exit(1)
		}
		fmt.Println("in netns: ok")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestKernelSyncAndConntrack runs a Proxier against the real nft and conntrack in
// a new network namespace (the test binary re-executed under `unshare --net`, so
// nothing touches the machine's own namespace): syncs load, an endpoint removal is
// an incremental sync of element operations only, which goes over netlink, while
// one that needs new chains goes through nft; the stale UDP conntrack entry goes
// while the live one stays, and Cleanup removes the tables.
func TestKernelSyncAndConntrack(t *testing.T) {
	testenv.RequireRoot(t, "unshare", "nft")
	cmd := exec.Command("unshare", "--net", os.Args[0])
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "in netns: ok") {
		t.Fatalf("kernel run: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "note:") {
			t.Log(l)
		}
	}
}

// inNetns is the body of TestKernelSyncAndConntrack, run inside the new namespace.
func inNetns() error {
	// Refuse to run anywhere but a fresh namespace, which has only lo.
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	if len(ifs) != 1 || ifs[0].Name != "lo" {
		return fmt.Errorf("refusing to run: not a fresh network namespace (interfaces %v)", ifs)
	}
	ctx := context.Background()
	const table = "nftproxy-kt"
	var synced []syncer.Result
	p, err := New(Config{
		NodeName:  "node-a",
		Ruleset:   ruleset.Config{Table: table, LocalMode: ruleset.LocalClusterCIDR, ClusterCIDRs: prefixes("10.0.0.0/8")},
		Families:  []knftables.Family{knftables.IPv4Family},
		Netlink:   KernelNetlink,
		Conntrack: conntrack.NewCleaner(),
		OnSynced: func(_ knftables.Family, _ *ruleset.Ruleset, res syncer.Result) {
			synced = append(synced, res)
		},
	})
	if err != nil {
		return err
	}
	// syncResult syncs the one family and returns what its sync did, as OnSynced saw it.
	syncResult := func(what string) (syncer.Result, error) {
		synced = nil
		if err := p.Sync(ctx); err != nil {
			return syncer.Result{}, fmt.Errorf("%s: %w", what, err)
		}
		if len(synced) != 1 {
			return syncer.Result{}, fmt.Errorf("%s: OnSynced called %d times, want once", what, len(synced))
		}
		fmt.Printf("note: %s: %+v\n", what, synced[0])
		return synced[0], nil
	}
	dnsSlice := func(eps ...endpoint) {
		p.OnEndpointSliceUpdate(slice("kube-system", "dns", "dns-1", []port{target(dnsPort, 5353)}, eps...))
	}
	p.OnServiceUpdate(service("kube-system", "dns", "172.30.0.53", dnsPort))
	dnsSlice(ep("10.1.0.9", "node-b"), ep("10.1.0.10", "node-b"))
	// A second Service with one endpoint, so that dnat-1 exists before dns drops
	// to one endpoint (see the end for a sync that needs a new dnat-N chain).
	p.OnServiceUpdate(service("kube-system", "other", "172.30.0.54", dnsPort))
	p.OnEndpointSliceUpdate(slice("kube-system", "other", "other-1", []port{target(dnsPort, 5353)}, ep("10.1.0.20", "node-b")))
	res, err := syncResult("first sync")
	if err != nil {
		return err
	}
	// With KernelNetlink, elements go over netlink, and did.
	if !p.syncers[knftables.IPv4Family].Netlink() {
		return errors.New("the Syncer of a Proxier with KernelNetlink does not write elements over netlink")
	}
	if !res.Full || res.NetlinkElements == 0 {
		return fmt.Errorf("first sync %+v: want a full sync with its elements over netlink", res)
	}
	nft, err := knftables.New(knftables.IPv4Family, table)
	if err != nil {
		return err
	}
	if err := wantBackends(ctx, nft, "10.1.0.10 . 5353", "10.1.0.20 . 5353", "10.1.0.9 . 5353"); err != nil {
		return err
	}

	stale := udpFlow("10.1.0.99:4000", "172.30.0.53:53", "10.1.0.9:5353")
	live := udpFlow("10.1.0.99:4001", "172.30.0.53:53", "10.1.0.10:5353")
	for _, f := range []*netlink.ConntrackFlow{stale, live} {
		if err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
			return fmt.Errorf("creating conntrack entry: %w", err)
		}
	}

	// An endpoint removal changes elements only: an incremental sync whose every
	// operation goes over netlink.
	dnsSlice(ep("10.1.0.10", "node-b"))
	if res, err = syncResult("second sync (endpoint removal)"); err != nil {
		return err
	}
	if res.Full || res.Operations == 0 || res.NetlinkElements != res.Operations || res.Fallback != nil {
		return fmt.Errorf("second sync (endpoint removal) %+v: want an incremental sync of element operations, all over netlink", res)
	}
	if err := wantBackends(ctx, nft, "10.1.0.10 . 5353", "10.1.0.20 . 5353"); err != nil {
		return err
	}
	ports, err := conntrackSourcePorts()
	if err != nil {
		return err
	}
	if !slices.Equal(ports, []uint16{4001}) {
		return fmt.Errorf("conntrack entries left from client ports %v, want only the live one (4001)", ports)
	}

	// A Service with a new endpoint count needs new shared chains and backends
	// maps; the incremental sync must add them.
	p.OnServiceUpdate(service("default", "three", "172.30.0.60", dnsPort))
	p.OnEndpointSliceUpdate(slice("default", "three", "three-1", []port{target(dnsPort, 53)},
		ep("10.1.0.31", "node-b"), ep("10.1.0.32", "node-b"), ep("10.1.0.33", "node-b")))
	if res, err = syncResult("incremental sync adding chain dnat-3"); err != nil {
		return err
	}
	if res.Full || res.NetlinkElements >= res.Operations {
		return fmt.Errorf("incremental sync adding chain dnat-3 %+v: want an incremental sync through nft, as it adds chains", res)
	}
	els, err := nft.ListElements(ctx, "set", ruleset.ClassSet(ruleset.ChainServiceIPs, "goto dnat-3"))
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(els, func(e *knftables.Element) bool { return e.Key[0] == "172.30.0.60" }) {
		return fmt.Errorf("service-ips-to-dnat-3 lacks the new Service: %v", els)
	}

	if err := Cleanup(ctx, DefaultNewNFT, table); err != nil {
		return err
	}
	if _, err := nft.List(ctx, "chains"); !knftables.IsNotFound(err) {
		return fmt.Errorf("table still there after Cleanup (list: %v)", err)
	}
	return nil
}

// wantBackends checks the values of the kernel's backends maps.
func wantBackends(ctx context.Context, nft knftables.Interface, want ...string) error {
	maps, err := nft.List(ctx, "map")
	if err != nil {
		return fmt.Errorf("listing maps: %w", err)
	}
	var got []string
	for _, m := range maps {
		if !strings.HasPrefix(m, "backends-") {
			continue
		}
		els, err := nft.ListElements(ctx, "map", m)
		if err != nil {
			return fmt.Errorf("listing %s: %w", m, err)
		}
		for _, e := range els {
			got = append(got, strings.Join(e.Value, " . "))
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return fmt.Errorf("backends values %q, want %q", got, want)
	}
	return nil
}

// udpFlow is a conntrack entry for a UDP flow from src to dst DNATed to ep.
func udpFlow(src, dst, ep string) *netlink.ConntrackFlow {
	s, d, e := ap(src), ap(dst), ap(ep)
	ip := func(a net.IP) net.IP { return a.To4() }
	return &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward: netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: ip(s.Addr().AsSlice()), SrcPort: s.Port(),
			DstIP: ip(d.Addr().AsSlice()), DstPort: d.Port()},
		Reverse: netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: ip(e.Addr().AsSlice()), SrcPort: e.Port(),
			DstIP: ip(s.Addr().AsSlice()), DstPort: s.Port()},
		TimeOut: 120,
	}
}

// conntrackSourcePorts returns the client ports of the namespace's UDP entries.
func conntrackSourcePorts() ([]uint16, error) {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("listing conntrack: %w", err)
	}
	var ports []uint16
	for _, f := range flows {
		if f.Forward.Protocol == unix.IPPROTO_UDP {
			ports = append(ports, f.Forward.SrcPort)
		}
	}
	slices.Sort(ports)
	return ports, nil
}
