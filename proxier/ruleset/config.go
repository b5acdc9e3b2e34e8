package ruleset

import (
	"errors"
	"fmt"
	"net/netip"
)

// DefaultTable is the name of the proxier's table in each family.
const DefaultTable = "nftproxy"

// DefaultMasqueradeBit is the bit of the packet mark that requests masquerading.
const DefaultMasqueradeBit = 14

// LocalMode says how traffic from this node's pods is told apart from other traffic.
type LocalMode string

// The local-traffic detectors.
const (
	// LocalNone treats no traffic as pod traffic.
	LocalNone LocalMode = ""
	// LocalClusterCIDR treats sources in Config.ClusterCIDRs as pod traffic.
	LocalClusterCIDR LocalMode = "ClusterCIDR"
	// LocalInterfacePrefix treats packets arriving on interfaces whose names start
	// with Config.InterfacePrefix as pod traffic.
	LocalInterfacePrefix LocalMode = "InterfaceNamePrefix"
)

// Config holds every knob of the ruleset. The zero value, after Defaults, is usable.
type Config struct {
	// Table is the table name used in each family (default "nftproxy").
	Table string
	// LocalMode selects the pod-traffic detector.
	LocalMode LocalMode
	// ClusterCIDRs are the pod CIDRs (either family), used by LocalClusterCIDR.
	ClusterCIDRs []netip.Prefix
	// InterfacePrefix is the pod interface name prefix, used by LocalInterfacePrefix.
	InterfacePrefix string
	// MasqueradeAll masquerades all traffic to ClusterIPs.
	MasqueradeAll bool
	// MasqueradeBit is the mark bit that requests masquerading (default 14).
	MasqueradeBit int
	// NodePortAddresses restricts NodePorts to node addresses inside these prefixes,
	// per family: a family without a prefix here uses all of the node's addresses of
	// that family (as kube-proxy does). Loopback addresses never serve NodePorts.
	NodePortAddresses []netip.Prefix
	// ServiceCIDRs are the ranges ClusterIPs are allocated from; traffic to an
	// unallocated address in them is dropped.
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

// Validate reports every invalid field of c.
func (c *Config) Validate() error {
	var errs []error
	switch c.LocalMode {
	case LocalNone:
	case LocalClusterCIDR:
		if len(c.ClusterCIDRs) == 0 {
			errs = append(errs, errors.New("config: localMode ClusterCIDR needs clusterCIDRs"))
		}
	case LocalInterfacePrefix:
		if c.InterfacePrefix == "" {
			errs = append(errs, errors.New("config: localMode InterfaceNamePrefix needs interfacePrefix"))
		}
	default:
		errs = append(errs, fmt.Errorf("config: localMode %q: want ClusterCIDR or InterfaceNamePrefix", c.LocalMode))
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		errs = append(errs, fmt.Errorf("config: masqueradeBit %d: want 0..31", c.MasqueradeBit))
	}
	for field, ps := range map[string][]netip.Prefix{"clusterCIDRs": c.ClusterCIDRs, "nodePortAddresses": c.NodePortAddresses, "serviceCIDRs": c.ServiceCIDRs} {
		for _, p := range ps {
			if !p.IsValid() {
				errs = append(errs, fmt.Errorf("config: %s: invalid prefix %v", field, p))
			}
		}
	}
	return errors.Join(errs...)
}
