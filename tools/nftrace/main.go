// Command nftrace shows, hop by hop, what an nftables ruleset does to a packet: the
// ruleset nftproxy builds for a cluster file, a saved `nft list ruleset` dump, or the
// live ruleset of the network namespace it runs in.
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
	"github.com/nftproxy/nftproxy/sim"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "nftrace:", err)
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	cluster      string
	node         string
	rulesetFile  string
	live         bool
	local        string
	jsonOut      bool
	color        string
	printRuleset bool
	// cfg is the ruleset configuration for --cluster, from the same flags as the
	// daemon's; warnings say what it leaves unknown (printed with --cluster).
	cfg      ruleset.Config
	warnings []string
}

func parseFlags(args []string, stderr io.Writer) (*options, []string, error) {
	o := &options{}
	fs := flag.NewFlagSet("nftrace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cluster, "cluster", "", "cluster file: Kubernetes YAML with Services, EndpointSlices and Nodes")
	fs.StringVar(&o.node, "node", "", "the node whose ruleset is built (default: the only Node in the cluster file)")
	fs.StringVar(&o.rulesetFile, "ruleset", "", "trace through a ruleset file (`nft list ruleset` output or nft -f syntax); - reads stdin")
	fs.BoolVar(&o.live, "live", false, "trace through the live ruleset of this network namespace (runs `nft list ruleset`)")
	fs.StringVar(&o.local, "local", "", "the node's own addresses, comma separated, for the routing decision (default: the Node's addresses with --cluster, this namespace's with --live)")
	fs.BoolVar(&o.jsonOut, "json", false, "print one JSON object per packet")
	fs.StringVar(&o.color, "color", "auto", "highlight the deciding rules: auto, always or never")
	fs.BoolVar(&o.printRuleset, "print-ruleset", false, "print the ruleset built for the cluster (nft -f syntax) and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: nftrace (--cluster FILE | --ruleset FILE | --live) [flags] PACKET...\n\n")
		fmt.Fprintf(stderr, "PACKET is e.g. 'tcp 10.0.0.5:40000 -> 172.30.0.41:80 iif eth0' or 'udp [fd00::5]:53000 -> [fd00::10]:53'.\n\n")
		fs.PrintDefaults()
	}
	var rs ruleset.Options
	rs.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	cfg, warnings, err := rs.Config()
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	o.cfg, o.warnings = cfg, warnings
	return o, fs.Args(), nil
}

func run(args []string, stdout, stderr io.Writer) error {
	o, pkts, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	sources := 0
	for _, set := range []bool{o.cluster != "", o.rulesetFile != "", o.live} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return errors.New("give exactly one of --cluster FILE, --ruleset FILE or --live")
	}
	if o.printRuleset && o.cluster == "" {
		return errors.New("--print-ruleset needs --cluster")
	}
	packets, err := parsePackets(pkts)
	if err != nil {
		return err
	}
	if !o.printRuleset && len(packets) == 0 {
		return errors.New("no packet to trace: give one or more PACKET arguments")
	}
	prog, local, err := load(o, stdout, stderr)
	if err != nil || prog == nil {
		return err
	}
	if o.local != "" {
		local, err = parseAddrs(o.local)
		if err != nil {
			return fmt.Errorf("--local: %w", err)
		}
	}
	env := sim.Env{LocalAddrs: local}
	return trace(prog, env, packets, o, stdout)
}

// parsePackets parses every PACKET argument, reporting all errors with the column.
func parsePackets(args []string) ([]packet.Packet, error) {
	var out []packet.Packet
	var errs []error
	for i, a := range args {
		p, err := packet.Parse(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("packet %d %q: %w", i+1, a, err))
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

func parseAddrs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("invalid address %q", f)
		}
		out = append(out, a)
	}
	return out, nil
}

// load compiles the ruleset the options name, and returns the node addresses it
// implies. With --print-ruleset it prints the ruleset and returns a nil program.
func load(o *options, stdout, stderr io.Writer) (*sim.Program, []netip.Addr, error) {
	switch {
	case o.cluster != "":
		for _, w := range o.warnings {
			fmt.Fprintf(stderr, "nftrace: warning: %s\n", w)
		}
		fakes, node, err := buildCluster(o, stderr, nil)
		if err != nil {
			return nil, nil, err
		}
		var text strings.Builder
		for _, f := range fakes {
			text.WriteString(f.Dump())
		}
		if o.printRuleset {
			fmt.Fprint(stdout, text.String())
			return nil, nil, nil
		}
		prog, err := sim.CompileText(text.String())
		if err != nil {
			return nil, nil, fmt.Errorf("compiling the ruleset built for %s: %w", o.cluster, err)
		}
		return prog, node.Addresses, nil
	case o.rulesetFile != "":
		var data []byte
		var err error
		if o.rulesetFile == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(o.rulesetFile)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading the ruleset: %w", err)
		}
		prog, err := sim.CompileText(string(data))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", o.rulesetFile, err)
		}
		return prog, nil, nil
	default:
		return loadLive()
	}
}

// loadLive reads the ruleset of the network namespace nftrace runs in, and the
// addresses of its interfaces.
func loadLive() (*sim.Program, []netip.Addr, error) {
	out, err := exec.Command("nft", "list", "ruleset").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, nil, fmt.Errorf("nft list ruleset: %w", err)
	}
	prog, err := sim.CompileText(string(out))
	if err != nil {
		return nil, nil, fmt.Errorf("live ruleset: %w", err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, nil, fmt.Errorf("listing this namespace's addresses: %w", err)
	}
	var local []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			local = append(local, p.Addr())
		}
	}
	return prog, local, nil
}

// buildCluster builds the tables of the cluster file's node as the daemon does: the
// file's objects go into a proxier.Proxier, whose first sync writes each family's
// table into a knftables.Fake through its nft writer and, over netlink batches
// decoded back into operations, its element writer. Invalid objects are reported on
// stderr and skipped. onSynced, when not nil, is the Proxier's Config.OnSynced.
func buildCluster(o *options, stderr io.Writer, onSynced func(knftables.Family, *ruleset.Ruleset, syncer.Result)) ([]*knftables.Fake, state.Node, error) {
	data, err := os.ReadFile(o.cluster)
	if err != nil {
		return nil, state.Node{}, fmt.Errorf("cluster file: %w", err)
	}
	nodeName, err := clusterNode(data, o)
	if err != nil {
		return nil, state.Node{}, err
	}
	fakes := map[knftables.Family]*knftables.Fake{}
	p, err := proxier.New(proxier.Config{
		NodeName: nodeName,
		Ruleset:  o.cfg,
		Families: []knftables.Family{knftables.IPv4Family, knftables.IPv6Family},
		NewNFT: func(fam knftables.Family, table string) (knftables.Interface, error) {
			fakes[fam] = knftables.NewFake(fam, table)
			return fakes[fam], nil
		},
		Netlink: func(_ knftables.Family, nft knftables.Interface) syncer.Transport {
			return syncer.DecodedNetlink(nft)
		},
		OnSynced: onSynced,
	})
	if err != nil {
		return nil, state.Node{}, err
	}
	objErrs, err := p.Tracker().ApplyYAML(data, o.cluster)
	if err != nil {
		return nil, state.Node{}, err
	}
	for _, e := range objErrs {
		fmt.Fprintf(stderr, "nftrace: skipped: %v\n", e)
	}
	if err := p.Sync(context.Background()); err != nil {
		return nil, state.Node{}, fmt.Errorf("syncing the ruleset of %s: %w", o.cluster, err)
	}
	var out []*knftables.Fake
	for _, fam := range p.Families() {
		sortElements(fakes[fam])
		out = append(out, fakes[fam])
	}
	return out, p.Tracker().State().Node, nil
}

// sortElements orders the elements of every set and map of f by key, the order in
// which ruleset.Ruleset.AddTo queues them. A Fake keeps elements in the order they
// were added, and a netlink batch adds them in no particular order (as the kernel
// keeps its own); sorted, the printed ruleset and the traces are the same from one
// run to the next.
func sortElements(f *knftables.Fake) {
	if f.Table == nil {
		return
	}
	byKey := func(a, b *knftables.Element) int {
		return strings.Compare(ruleset.ElementKey(a), ruleset.ElementKey(b))
	}
	for _, set := range f.Table.Sets {
		slices.SortFunc(set.Elements, byKey)
	}
	for _, m := range f.Table.Maps {
		slices.SortFunc(m.Elements, byKey)
	}
}

// noNode names the node of a cluster file that has no Node, when --node names
// none: a Proxier needs a name, and this one is no Kubernetes name (not a DNS
// subdomain), so that no endpoint is local, as on a node without a name.
const noNode = "<no node>"

// clusterNode returns the name of the node whose tables are built: --node, else the
// only Node of the cluster file (state.LoadCluster chooses it, and refuses a file
// of several Nodes), else noNode.
func clusterNode(data []byte, o *options) (string, error) {
	if o.node != "" {
		return o.node, nil
	}
	st, _, err := state.LoadCluster(bytes.NewReader(data), o.cluster, "")
	if err != nil {
		return "", err
	}
	return cmp.Or(st.Node.Name, noNode), nil
}
