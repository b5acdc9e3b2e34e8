package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/knftables"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

// The apiVersions and kinds of the configuration files --config reads: the
// daemon's own (cmd/nftproxy) and kube-proxy's.
const (
	nftproxyConfig  = "nftproxy.io/v1alpha1 NftproxyConfiguration"
	kubeProxyConfig = "kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration"
)

// loadConfigFile reads the ruleset's settings from a daemon's --config file:
// nftproxy's NftproxyConfiguration or kube-proxy's KubeProxyConfiguration, with the
// daemon's meanings. Of nftproxy's kind only the ruleset's fields are read (the
// daemon checks the rest); kube-proxy's is decoded strictly, as the daemon does.
func loadConfigFile(path string) (ruleset.Options, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return ruleset.Options{}, fmt.Errorf("--config: %w", err)
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return ruleset.Options{}, fmt.Errorf("--config %s: %w", path, err)
	}
	switch tm.APIVersion + " " + tm.Kind {
	case nftproxyConfig:
		var c struct {
			ruleset.Options
		}
		j, err := yaml.YAMLToJSONStrict(data)
		if err == nil {
			_, err = kjson.UnmarshalStrict(j, &c, kjson.DisallowDuplicateFields)
		}
		if err != nil {
			return ruleset.Options{}, fmt.Errorf("--config %s: %w", path, err)
		}
		return c.Options, nil
	case kubeProxyConfig:
		var kp kpconfig.KubeProxyConfiguration
		if err := ruleset.DecodeStrict(data, &kp); err != nil {
			return ruleset.Options{}, fmt.Errorf("--config %s: %w", path, err)
		}
		o := ruleset.Options{
			ClusterCIDR:       kp.ClusterCIDR,
			DetectLocalMode:   string(kp.DetectLocalMode),
			DetectLocal:       ruleset.DetectLocalOptions{InterfaceNamePrefix: kp.DetectLocal.InterfaceNamePrefix},
			NodePortAddresses: kp.NodePortAddresses,
		}
		// The mode's own section holds masquerading: iptables' when the mode is
		// empty, as kube-proxy ran in that mode.
		o.MasqueradeAll, o.MasqueradeBit = kp.NFTables.MasqueradeAll, kp.NFTables.MasqueradeBit
		if kp.Mode == "" || kp.Mode == "iptables" {
			o.MasqueradeAll, o.MasqueradeBit = kp.IPTables.MasqueradeAll, kp.IPTables.MasqueradeBit
		}
		return o, nil
	}
	return ruleset.Options{}, fmt.Errorf("--config %s: apiVersion %q, kind %q: want %s or %s", path, tm.APIVersion, tm.Kind, nftproxyConfig, kubeProxyConfig)
}

// clusterInput is a cluster — a decoded cluster file, or the objects read from an
// API server — and what nftrace takes from it.
type clusterInput struct {
	// name names the cluster in messages: the file's path, or the API server's.
	name string
	// nodes are the cluster's Nodes.
	nodes []*v1.Node
	// apply records the cluster's objects in a Tracker and returns the errors of
	// those skipped.
	apply func(*state.Tracker) []error
	// node is the name of the node whose tables are built.
	node string
	// nodeless is true when the cluster has no Node: the node's addresses are --local's.
	nodeless bool
	// podCIDRs are the Nodes' spec.podCIDRs, when they gave clusterCIDR.
	podCIDRs []string
}

// noNode names the node of a cluster file that has no Node, when --node names
// none: a Proxier needs a name, and this one is no Kubernetes name (not a DNS
// subdomain), so that no endpoint is local, as on a node without a name.
const noNode = "<no node>"

// readCluster reads the cluster of o — the cluster file, skipping the kinds nftrace
// does not read with one note on stderr, or the API server's objects — chooses the
// node, and sets o's clusterCIDR from the Nodes' spec.podCIDRs when neither a flag
// nor --config gave it. o.cfg is then the Config to build with.
func readCluster(o *options, stderr io.Writer) (*clusterInput, error) {
	var in *clusterInput
	if o.apiServer {
		var err error
		if in, err = readAPIServer(o, stderr); err != nil {
			return nil, err
		}
	} else {
		data, err := os.ReadFile(o.cluster)
		if err != nil {
			return nil, fmt.Errorf("cluster file: %w", err)
		}
		f, err := state.DecodeClusterFile(data, o.cluster, true)
		if err != nil {
			return nil, err
		}
		if len(f.Skipped) > 0 {
			fmt.Fprintf(stderr, "nftrace: note: skipped %d objects of kinds nftrace does not read: %s\n", len(f.Skipped), countKinds(f.Skipped))
		}
		in = &clusterInput{name: o.cluster, nodes: f.Nodes(), apply: f.Apply}
	}
	var names []string
	for _, n := range in.nodes {
		if !slices.Contains(names, n.Name) {
			names = append(names, n.Name)
		}
	}
	switch {
	case o.node != "" && len(names) > 0 && !slices.Contains(names, o.node):
		return nil, fmt.Errorf("--node %s: %s has no Node of that name; its Nodes: %s", o.node, in.name, strings.Join(names, ", "))
	case o.node != "":
		in.node = o.node
	case len(names) == 1:
		in.node = names[0]
	case len(names) > 1:
		return nil, fmt.Errorf("%s: %d Nodes (%s): choose one with --node NAME", in.name, len(names), strings.Join(names, ", "))
	default:
		in.node = noNode
	}
	in.nodeless = len(names) == 0
	if o.rs.ClusterCIDR == "" && (o.rs.DetectLocalMode == "" || o.rs.DetectLocalMode == string(ruleset.LocalClusterCIDR)) {
		for _, n := range in.nodes {
			for _, c := range append([]string{n.Spec.PodCIDR}, n.Spec.PodCIDRs...) {
				if c != "" && !slices.Contains(in.podCIDRs, c) {
					in.podCIDRs = append(in.podCIDRs, c)
				}
			}
		}
		if len(in.podCIDRs) > 0 {
			rs := o.rs
			rs.ClusterCIDR = strings.Join(in.podCIDRs, ",")
			cfg, _, err := rs.Config()
			if err != nil {
				return nil, fmt.Errorf("%s: the Nodes' spec.podCIDRs: %w", in.name, err)
			}
			o.rs, o.cfg = rs, cfg
		}
	}
	return in, nil
}

// countKinds lists kinds with their counts, most frequent first: "Pod (3), ConfigMap (1)".
func countKinds(kinds []string) string {
	counts := map[string]int{}
	var order []string
	for _, k := range kinds {
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	slices.SortStableFunc(order, func(a, b string) int { return counts[b] - counts[a] })
	var out []string
	for _, k := range order {
		out = append(out, fmt.Sprintf("%s (%d)", k, counts[k]))
	}
	return strings.Join(out, ", ")
}

// explain prints, after the build, where the CIDRs came from when the cluster gave
// them, and one warning naming what stays unknown.
func explain(o *options, in *clusterInput, st *state.ClusterState, stderr io.Writer) {
	if len(in.podCIDRs) > 0 {
		fmt.Fprintf(stderr, "nftrace: note: clusterCIDR from the Nodes' spec.podCIDRs: %s\n", strings.Join(in.podCIDRs, ","))
	}
	if o.rs.ServiceCIDR == "" && len(st.ServiceCIDRs) > 0 {
		fmt.Fprintf(stderr, "nftrace: note: serviceCIDR from the ServiceCIDR objects: %s\n", joinPrefixes(st.ServiceCIDRs))
	}
	var unknown []string
	if o.cfg.LocalMode == ruleset.LocalNone {
		unknown = append(unknown, "clusterCIDR (give --cluster-cidr or --config, or Nodes with spec.podCIDRs), so no traffic is treated as pod traffic")
	}
	if o.rs.ServiceCIDR == "" && len(st.ServiceCIDRs) == 0 {
		unknown = append(unknown, "serviceCIDR (give --service-cidr or --config, or ServiceCIDR objects), so traffic to unallocated ClusterIPs is not dropped")
	}
	if in.nodeless && o.local == "" {
		what := "the file"
		if o.apiServer {
			what = "the cluster"
		}
		unknown = append(unknown, "the node's addresses ("+what+" has no Node; give them with --local ADDR,...), so NodePorts and node addresses match nothing")
	}
	if len(unknown) > 0 {
		fmt.Fprintf(stderr, "nftrace: warning: unknown: %s\n", strings.Join(unknown, "; "))
	}
}

func joinPrefixes(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, ",")
}

// buildCluster builds the tables of the cluster's node as the daemon does: the
// cluster file's objects, or the API server's, go into a proxier.Proxier, whose first sync writes each family's
// table into a knftables.Fake through its nft writer and, over netlink batches
// decoded back into operations, its element writer. Invalid objects are reported on
// stderr and skipped, and so are, with one note, objects of other kinds. A file
// without Nodes gets one of the node's name with --local's addresses. onSynced, when
// not nil, is the Proxier's Config.OnSynced.
func buildCluster(o *options, stderr io.Writer, onSynced func(knftables.Family, *ruleset.Ruleset, syncer.Result)) ([]*knftables.Fake, *state.ClusterState, error) {
	in, err := readCluster(o, stderr)
	if err != nil {
		return nil, nil, err
	}
	fakes := map[knftables.Family]*knftables.Fake{}
	p, err := proxier.New(proxier.Config{
		NodeName: in.node,
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
		return nil, nil, err
	}
	for _, e := range in.apply(p.Tracker()) {
		fmt.Fprintf(stderr, "nftrace: skipped: %v\n", e)
	}
	if in.nodeless && o.local != "" {
		if err := p.Tracker().UpdateNode(localNode(in.node, o.local)); err != nil {
			return nil, nil, fmt.Errorf("--local: %w", err)
		}
	}
	if err := p.Sync(context.Background()); err != nil {
		return nil, nil, fmt.Errorf("syncing the ruleset of %s: %w", in.name, err)
	}
	var out []*knftables.Fake
	for _, fam := range p.Families() {
		sortElements(fakes[fam])
		out = append(out, fakes[fam])
	}
	st := p.Tracker().State()
	explain(o, in, st, stderr)
	return out, st, nil
}

// localNode is the Node of a cluster file without Nodes: named name, with the
// addresses of --local as its InternalIPs, so that its NodePorts are served there.
func localNode(name, local string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, a := range strings.Split(local, ",") {
		if a = strings.TrimSpace(a); a != "" {
			n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
		}
	}
	return n
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
