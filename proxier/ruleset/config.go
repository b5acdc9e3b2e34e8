package ruleset

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// DefaultTable is the name of the proxier's table in each family.
const DefaultTable = "nftproxy"

// DefaultMasqueradeBit is the bit of the packet mark that requests masquerading.
const DefaultMasqueradeBit = 14

// LocalMode says how traffic from this node's pods is told apart from other traffic.
// The values are kube-proxy's detectLocalMode names.
type LocalMode string

// The local-traffic detectors.
const (
	// LocalNone treats no traffic as pod traffic. Options.Config resolves
	// detectLocalMode ClusterCIDR without a clusterCIDR to it, with a warning.
	LocalNone LocalMode = ""
	// LocalClusterCIDR treats sources in Config.ClusterCIDRs as pod traffic.
	LocalClusterCIDR LocalMode = "ClusterCIDR"
	// LocalInterfacePrefix treats packets arriving on interfaces whose names start
	// with Config.InterfacePrefix as pod traffic.
	LocalInterfacePrefix LocalMode = "InterfaceNamePrefix"
	// LocalNodeCIDR treats sources in this node's pod CIDRs (the Node's
	// spec.podCIDRs, state.Node.PodCIDRs) as pod traffic. A family the Node has no
	// pod CIDR of, as yet, has no detector: the ruleset follows the Node, so the
	// next sync after the range is allocated detects with it.
	LocalNodeCIDR LocalMode = "NodeCIDR"
	// LocalBridgeInterface treats packets arriving on the interface named
	// Config.BridgeInterface (the bridge the node's pods are attached to) as pod
	// traffic.
	LocalBridgeInterface LocalMode = "BridgeInterface"
)

// Config holds every knob of the ruleset, resolved: Options is how people write it
// (configuration file fields and flags), and Options.Config the one way from there
// to here. The zero value, after Defaults, is usable: it detects no pod traffic and
// drops no unallocated service address. Errors of Validate name the fields as
// Options spells them (the Options field of each is given below).
type Config struct {
	// Table is the table name used in each family (tableName; default "nftproxy").
	Table string
	// LocalMode selects the pod-traffic detector (detectLocalMode).
	LocalMode LocalMode
	// ClusterCIDRs are the pod CIDRs, either family (clusterCIDR), used by
	// LocalClusterCIDR.
	ClusterCIDRs []netip.Prefix
	// InterfacePrefix is the pod interface name prefix, used by LocalInterfacePrefix
	// (detectLocal.interfaceNamePrefix).
	InterfacePrefix string
	// BridgeInterface is the name of the pods' bridge, used by LocalBridgeInterface
	// (detectLocal.bridgeInterface).
	BridgeInterface string
	// MasqueradeAll masquerades all traffic to ClusterIPs (masqueradeAll).
	MasqueradeAll bool
	// MasqueradeBit is the mark bit that requests masquerading (masqueradeBit;
	// default 14). Zero stands for unset.
	MasqueradeBit int
	// NodePortAddresses restricts NodePorts to node addresses inside these prefixes
	// and, with NodePortPrimary, to the node's primary IP, per family: a family
	// without a prefix here (and without NodePortPrimary) uses all of the node's
	// addresses of that family (nodePortAddresses; its keyword all is the zero
	// prefix of both families). Loopback addresses never serve NodePorts.
	NodePortAddresses []netip.Prefix
	// NodePortPrimary adds the node's primary IP of each family (state.Node's
	// PrimaryIPs) to the addresses that serve NodePorts (nodePortAddresses keyword
	// primary).
	NodePortPrimary bool
	// ServiceCIDRs are the ranges ClusterIPs are allocated from (serviceCIDR);
	// traffic to an unallocated address in them is dropped.
	ServiceCIDRs []netip.Prefix
}

// Defaults fills in unset fields.
func (c *Config) Defaults() {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.MasqueradeBit == 0 {
		c.MasqueradeBit = DefaultMasqueradeBit
	}
}

// Validate reports every invalid field of c, each as a *FieldError.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Err: fmt.Errorf(format, args...)})
	}
	switch c.LocalMode {
	case LocalNone:
	case LocalClusterCIDR:
		if len(c.ClusterCIDRs) == 0 {
			bad(fieldClusterCIDR, "required when detectLocalMode is ClusterCIDR")
		}
	case LocalInterfacePrefix:
		if c.InterfacePrefix == "" {
			bad(fieldInterfaceNamePrefix, "required when detectLocalMode is InterfaceNamePrefix")
		}
	case LocalNodeCIDR:
	case LocalBridgeInterface:
		if c.BridgeInterface == "" {
			bad(fieldBridgeInterface, "required when detectLocalMode is BridgeInterface")
		} else if err := checkInterfaceName(c.BridgeInterface); err != nil {
			bad(fieldBridgeInterface, "%q: %v", c.BridgeInterface, err)
		}
	default:
		bad(fieldDetectLocalMode, "%q: want ClusterCIDR, NodeCIDR, InterfaceNamePrefix or BridgeInterface", c.LocalMode)
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		bad(fieldMasqueradeBit, "%d: want 1..31", c.MasqueradeBit)
	}
	if c.Table == "" || strings.ContainsAny(c.Table, " \t\n;{}\"") {
		bad(fieldTableName, "%q is not a usable table name", c.Table)
	}
	for _, f := range []struct {
		field string
		ps    []netip.Prefix
	}{{fieldClusterCIDR, c.ClusterCIDRs}, {fieldNodePortAddresses, c.NodePortAddresses}, {fieldServiceCIDR, c.ServiceCIDRs}} {
		for _, p := range f.ps {
			if !p.IsValid() {
				bad(f.field, "invalid prefix %v", p)
			}
		}
	}
	return errors.Join(errs...)
}

// checkInterfaceName checks that name can name a Linux network interface (at most
// 15 bytes, no '/', ':' or blank, not "." or "..", as the kernel requires) and be
// matched exactly by nft's iifname: printable ASCII without '*' (a trailing one is
// nft's wildcard), '"' or '\\'.
func checkInterfaceName(name string) error {
	if len(name) > 15 {
		return errors.New("longer than 15 bytes, the kernel's limit for interface names")
	}
	if name == "." || name == ".." {
		return errors.New("not an interface name")
	}
	for _, r := range name {
		if r <= ' ' || r > '~' || strings.ContainsRune("/:*\"\\", r) {
			return fmt.Errorf("%q cannot be in an interface name here", r)
		}
	}
	return nil
}
