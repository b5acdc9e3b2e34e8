// Command nftrace shows, hop by hop, what an nftables ruleset does to a packet: the
// ruleset nftproxy builds for a cluster file, a saved `nft list ruleset` dump, or the
// live ruleset of the network namespace it runs in.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
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
	printRuleset bool
	cfg          ruleset.Config
}

func parseFlags(args []string, stderr io.Writer) (*options, []string, error) {
	o := &options{}
	fs := flag.NewFlagSet("nftrace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cluster, "cluster", "", "cluster file: Kubernetes YAML with Services, EndpointSlices and Nodes")
	fs.StringVar(&o.node, "node", "", "the node whose ruleset is built (default: the only Node in the cluster file)")
	fs.BoolVar(&o.printRuleset, "print-ruleset", false, "print the ruleset built for the cluster (nft -f syntax) and exit")
	clusterCIDR := fs.String("cluster-cidr", "10.0.0.0/8,fd00::/48", "pod CIDRs, comma separated (traffic from elsewhere to a ClusterIP is masqueraded)")
	serviceCIDR := fs.String("service-cidr", "172.30.0.0/16,fd00:30::/108", "service CIDRs, comma separated (unallocated addresses are dropped)")
	nodePortAddrs := fs.String("nodeport-addresses", "", "CIDRs of node addresses that serve NodePorts (default: all node addresses)")
	detect := fs.String("detect-local-mode", string(ruleset.LocalClusterCIDR), "how pod traffic is recognised: ClusterCIDR or InterfaceNamePrefix")
	fs.StringVar(&o.cfg.InterfacePrefix, "pod-interface-name-prefix", "", "pod interface prefix for --detect-local-mode=InterfaceNamePrefix")
	fs.BoolVar(&o.cfg.MasqueradeAll, "masquerade-all", false, "masquerade all traffic to ClusterIPs")
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	o.cfg.LocalMode = ruleset.LocalMode(*detect)
	var errs []error
	for _, f := range []struct {
		name string
		val  string
		dst  *[]netip.Prefix
	}{{"cluster-cidr", *clusterCIDR, &o.cfg.ClusterCIDRs}, {"service-cidr", *serviceCIDR, &o.cfg.ServiceCIDRs}, {"nodeport-addresses", *nodePortAddrs, &o.cfg.NodePortAddresses}} {
		ps, err := parsePrefixes(f.val)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.name, err))
		}
		*f.dst = ps
	}
	o.cfg.Defaults()
	if err := o.cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	return o, fs.Args(), errors.Join(errs...)
}

func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("invalid CIDR %q", f)
		}
		out = append(out, p)
	}
	return out, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	o, _, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.cluster == "" {
		return errors.New("--cluster FILE is required")
	}
	fakes, err := buildCluster(o, stderr)
	if err != nil {
		return err
	}
	if o.printRuleset {
		for _, f := range fakes {
			fmt.Fprint(stdout, f.Dump())
		}
		return nil
	}
	return errors.New("nothing to do: give --print-ruleset")
}

// buildCluster loads the cluster file and syncs the ruleset for each family into a
// knftables.Fake through the production Syncer. Invalid objects are reported on
// stderr and skipped.
func buildCluster(o *options, stderr io.Writer) ([]*knftables.Fake, error) {
	st, objErrs, err := state.LoadClusterFile(o.cluster, o.node)
	if err != nil {
		return nil, err
	}
	for _, e := range objErrs {
		fmt.Fprintf(stderr, "nftrace: skipped: %v\n", e)
	}
	var fakes []*knftables.Fake
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		f := knftables.NewFake(fam, o.cfg.Table)
		if _, err := syncer.New(f).Sync(context.Background(), ruleset.Build(st, o.cfg, fam)); err != nil {
			return nil, fmt.Errorf("syncing the %s ruleset: %w", fam, err)
		}
		fakes = append(fakes, f)
	}
	return fakes, nil
}
