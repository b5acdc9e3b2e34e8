package ruleset

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The fields of Options as a configuration file spells them: kube-proxy's
// KubeProxyConfiguration names where kube-proxy has the setting.
const (
	fieldClusterCIDR         = "clusterCIDR"
	fieldDetectLocalMode     = "detectLocalMode"
	fieldInterfaceNamePrefix = "detectLocal.interfaceNamePrefix"
	fieldBridgeInterface     = "detectLocal.bridgeInterface"
	fieldNodePortAddresses   = "nodePortAddresses"
	fieldMasqueradeAll       = "masqueradeAll"
	fieldMasqueradeBit       = "masqueradeBit"
	fieldServiceCIDR         = "serviceCIDR"
	fieldTableName           = "tableName"
)

// fieldFlags names the flag of each field (kube-proxy's flag where it has one).
var fieldFlags = map[string]string{
	fieldClusterCIDR:         "cluster-cidr",
	fieldDetectLocalMode:     "detect-local-mode",
	fieldInterfaceNamePrefix: "pod-interface-name-prefix",
	fieldBridgeInterface:     "pod-bridge-interface",
	fieldNodePortAddresses:   "nodeport-addresses",
	fieldMasqueradeAll:       "masquerade-all",
	fieldMasqueradeBit:       "iptables-masquerade-bit",
	fieldServiceCIDR:         "service-cidr",
	fieldTableName:           "table-name",
}

// Options is the ruleset's configuration as people write it: the fields of a
// configuration file, in kube-proxy's KubeProxyConfiguration names and meanings where
// kube-proxy has the setting, and the equivalent flags (AddFlags). The daemon's
// configuration file holds these fields inline, nftrace has the flags and a feature
// scenario's config section is this fragment; all three turn it into a Config through
// Options.Config, so the defaults and the validation are the same everywhere.
//
//	clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
//	serviceCIDR: 10.96.0.0/12,fd00:10:96::/112
//	detectLocalMode: InterfaceNamePrefix
//	detectLocal: {interfaceNamePrefix: veth}
//	nodePortAddresses: [192.168.0.0/24]
//	masqueradeAll: false
//	masqueradeBit: 14
//	tableName: nftproxy
type Options struct {
	// ClusterCIDR is the pods' CIDRs, comma-separated, either family (kube-proxy's
	// clusterCIDR, --cluster-cidr). With detectLocalMode ClusterCIDR, traffic from
	// them is pod traffic; unset, no traffic is (with a warning).
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	// DetectLocalMode tells pod traffic apart (kube-proxy's detectLocalMode,
	// --detect-local-mode): ClusterCIDR (the default, as in kube-proxy), NodeCIDR
	// (sources in the Node's spec.podCIDRs; as kube-proxy, a family the Node has no
	// pod CIDR of has no detector, but where kube-proxy waits for the range at start
	// and exits when it changes, nftproxy follows the Node), InterfaceNamePrefix or
	// BridgeInterface.
	DetectLocalMode string `json:"detectLocalMode,omitempty"`
	// DetectLocal holds the detectors' settings (kube-proxy's detectLocal).
	DetectLocal DetectLocalOptions `json:"detectLocal,omitempty"`
	// NodePortAddresses restricts NodePorts to the node addresses inside these CIDRs
	// (kube-proxy's nodePortAddresses, --nodeport-addresses), and takes kube-proxy's
	// keywords: primary (the node's primary IP of each family, Node.PrimaryIPs) and
	// all (every node address). A family without a CIDR or keyword of its own uses
	// every node address of that family, as in kube-proxy. Unlike kube-proxy's
	// nftables mode, which defaults to primary, unset means all: the node
	// addresses are those of the Node object (its InternalIPs and ExternalIPs), not
	// every address of the host's interfaces. kube-proxy's localhost keyword is
	// refused: nftproxy never serves NodePorts on loopback.
	NodePortAddresses []string `json:"nodePortAddresses,omitempty"`
	// MasqueradeAll masquerades all traffic to ClusterIPs (kube-proxy's
	// iptables.masqueradeAll and nftables.masqueradeAll, --masquerade-all).
	MasqueradeAll bool `json:"masqueradeAll,omitempty"`
	// MasqueradeBit is the packet mark bit that requests masquerading, 1..31,
	// default 14 (kube-proxy's iptables.masqueradeBit, --iptables-masquerade-bit;
	// kube-proxy also allows 0, which Config cannot tell from unset).
	MasqueradeBit *int32 `json:"masqueradeBit,omitempty"`
	// ServiceCIDR is the ranges ClusterIPs are allocated from, comma-separated,
	// either family (--service-cidr, nftproxy's own): traffic to an unallocated
	// address in them is dropped. Unset, nothing is (with a warning).
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// TableName is the nftables table in each family (--table-name, nftproxy's
	// own; default nftproxy).
	TableName string `json:"tableName,omitempty"`
}

// DetectLocalOptions are the settings of the pod-traffic detectors (kube-proxy's
// DetectLocalConfiguration).
type DetectLocalOptions struct {
	// InterfaceNamePrefix is the pod interfaces' name prefix, for detectLocalMode
	// InterfaceNamePrefix (--pod-interface-name-prefix).
	InterfaceNamePrefix string `json:"interfaceNamePrefix,omitempty"`
	// BridgeInterface is the name of the bridge the node's pods are attached to,
	// for detectLocalMode BridgeInterface (kube-proxy's --pod-bridge-interface).
	BridgeInterface string `json:"bridgeInterface,omitempty"`
}

// FieldError is an invalid field of a ruleset configuration, named as a
// configuration file spells it (Options) and by its flag.
type FieldError struct {
	// Field is the file's name of the field, e.g. "detectLocal.interfaceNamePrefix".
	Field string
	Err   error
}

// Error names the field and its flag: `detectLocalMode (--detect-local-mode): ...`.
func (e *FieldError) Error() string {
	if f, ok := fieldFlags[e.Field]; ok {
		return fmt.Sprintf("%s (--%s): %v", e.Field, f, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Field, e.Err)
}

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// DecodeOptions decodes a YAML or JSON document holding Options' fields only,
// strictly (see DecodeStrict).
func DecodeOptions(data []byte) (Options, error) {
	var o Options
	err := DecodeStrict(data, &o)
	return o, err
}

// DecodeStrict decodes a YAML or JSON document into v, a struct that holds Options
// (inline, as an embedded field) or is Options. Field names are matched exactly: an
// unknown, wrongly-cased or duplicate field is an error naming it, as the Kubernetes
// API server's strict decoding does.
func DecodeStrict(data []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// AddFlags registers the flags of o's fields on fs, with kube-proxy's flag names.
// The flags' defaults are o's current values, so that fs parsed over Options loaded
// from a file changes only the fields whose flags are given.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.ClusterCIDR, fieldFlags[fieldClusterCIDR], o.ClusterCIDR,
		"comma-separated pod CIDRs, both families: with --detect-local-mode ClusterCIDR traffic from them is pod traffic (unset: none is)")
	fs.StringVar(&o.ServiceCIDR, fieldFlags[fieldServiceCIDR], o.ServiceCIDR,
		"comma-separated Service CIDRs, both families: traffic to unallocated ClusterIPs in them is dropped (unset: none is)")
	fs.StringVar(&o.DetectLocalMode, fieldFlags[fieldDetectLocalMode], o.DetectLocalMode,
		"how pod traffic is told apart: ClusterCIDR (default), NodeCIDR (the Node's spec.podCIDRs), InterfaceNamePrefix or BridgeInterface")
	fs.StringVar(&o.DetectLocal.InterfaceNamePrefix, fieldFlags[fieldInterfaceNamePrefix], o.DetectLocal.InterfaceNamePrefix,
		"pod interface name prefix, for --detect-local-mode InterfaceNamePrefix")
	fs.StringVar(&o.DetectLocal.BridgeInterface, fieldFlags[fieldBridgeInterface], o.DetectLocal.BridgeInterface,
		"the pods' bridge interface, for --detect-local-mode BridgeInterface")
	fs.Var((*listFlag)(&o.NodePortAddresses), fieldFlags[fieldNodePortAddresses],
		"comma-separated CIDRs and keywords primary (the node's primary IP of each family) and all: NodePorts are served only on node addresses they cover (default all node addresses)")
	fs.BoolVar(&o.MasqueradeAll, fieldFlags[fieldMasqueradeAll], o.MasqueradeAll,
		"masquerade all traffic to Service ClusterIPs")
	fs.Var(&optionalInt32{&o.MasqueradeBit}, fieldFlags[fieldMasqueradeBit],
		"the packet mark bit that requests masquerading, 1..31 (default 14)")
	fs.StringVar(&o.TableName, fieldFlags[fieldTableName], o.TableName,
		"name of nftproxy's table in each family (default nftproxy)")
}

// listFlag is a flag.Value for a comma-separated list; each Set replaces the list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = splitList(v)
	return nil
}

// optionalInt32 is a flag.Value for an int32 that may be unset (nil).
type optionalInt32 struct{ p **int32 }

func (f *optionalInt32) String() string {
	if f.p == nil || *f.p == nil {
		return ""
	}
	return strconv.Itoa(int(**f.p))
}

func (f *optionalInt32) Set(v string) error {
	n, err := strconv.ParseInt(v, 0, 32)
	if err != nil {
		return fmt.Errorf("%q is not a number", v)
	}
	i := int32(n)
	*f.p = &i
	return nil
}

// splitList splits a comma-separated list, dropping blanks around and between items.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Config resolves o into a Config with the defaults applied and validated, and
// returns the warnings the caller must show: a setting left unset that makes the
// ruleset do less (no pod-traffic detector, no drop of unallocated service
// addresses), so that nothing is ever assumed silently. Every error is a *FieldError.
func (o Options) Config() (Config, []string, error) {
	var errs []error
	var err error
	c := Config{Table: o.TableName, MasqueradeAll: o.MasqueradeAll,
		InterfacePrefix: o.DetectLocal.InterfaceNamePrefix, BridgeInterface: o.DetectLocal.BridgeInterface}
	cidrs := func(field string, ss []string) []netip.Prefix {
		ps, err := parsePrefixes(ss)
		if err != nil {
			errs = append(errs, &FieldError{Field: field, Err: err})
		}
		return ps
	}
	c.ClusterCIDRs = cidrs(fieldClusterCIDR, splitList(o.ClusterCIDR))
	c.ServiceCIDRs = cidrs(fieldServiceCIDR, splitList(o.ServiceCIDR))
	c.NodePortAddresses, c.NodePortPrimary, err = parseNodePortAddresses(o.NodePortAddresses)
	if err != nil {
		errs = append(errs, &FieldError{Field: fieldNodePortAddresses, Err: err})
	}
	if o.MasqueradeBit != nil {
		if b := *o.MasqueradeBit; b < 1 || b > 31 {
			errs = append(errs, &FieldError{Field: fieldMasqueradeBit, Err: fmt.Errorf("%d: want 1..31", b)})
		} else {
			c.MasqueradeBit = int(b)
		}
	}
	c.LocalMode = LocalMode(o.DetectLocalMode)
	if c.LocalMode == "" {
		c.LocalMode = LocalClusterCIDR // kube-proxy's default
	}
	var unset []string
	if c.LocalMode == LocalClusterCIDR && len(c.ClusterCIDRs) == 0 {
		// As kube-proxy: without a cluster CIDR, the ClusterCIDR detector
		// detects nothing. An invalid clusterCIDR is reported above, not as
		// missing.
		c.LocalMode = LocalNone
		if len(splitList(o.ClusterCIDR)) == 0 {
			unset = append(unset, fieldClusterCIDR+", so detectLocalMode ClusterCIDR treats no traffic as pod traffic")
		}
	}
	if len(splitList(o.ServiceCIDR)) == 0 {
		unset = append(unset, fieldServiceCIDR+", so traffic to unallocated ClusterIPs is not dropped")
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return Config{}, nil, errors.Join(errs...)
	}
	var warnings []string
	if len(unset) > 0 {
		warnings = append(warnings, "not set: "+strings.Join(unset, "; "))
	}
	return c, warnings, nil
}

// The keywords nodePortAddresses may hold besides CIDRs: kube-proxy's
// NodePortAddressesPrimary, NodePortAddressesAll and NodePortAddressesLocalhost.
const (
	nodePortPrimary   = "primary"
	nodePortAll       = "all"
	nodePortLocalhost = "localhost"
)

// parseNodePortAddresses parses nodePortAddresses: CIDRs (host bits masked) and
// kube-proxy's keywords, each keyword at most once. all stands for the zero CIDR of
// both families, as kube-proxy expands it; primary is returned apart, since the
// node's primary IPs are known only when the ruleset is built.
func parseNodePortAddresses(ss []string) (ps []netip.Prefix, primary bool, err error) {
	var errs []error
	seen := map[string]bool{}
	for _, s := range ss {
		switch s {
		case nodePortPrimary, nodePortAll, nodePortLocalhost:
			if seen[s] {
				errs = append(errs, fmt.Errorf("keyword %q given twice", s))
				continue
			}
			seen[s] = true
		}
		switch s {
		case nodePortPrimary:
			primary = true
		case nodePortAll:
			ps = append(ps, netip.PrefixFrom(netip.IPv4Unspecified(), 0), netip.PrefixFrom(netip.IPv6Unspecified(), 0))
		case nodePortLocalhost:
			errs = append(errs, fmt.Errorf("keyword %q: not supported, NodePorts are never served on loopback addresses", s))
		default:
			p, err := netip.ParsePrefix(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("invalid CIDR %q: want CIDRs and the keywords %s, %s", s, nodePortPrimary, nodePortAll))
				continue
			}
			ps = append(ps, p.Masked())
		}
	}
	if len(errs) > 0 {
		return nil, false, errors.Join(errs...)
	}
	return ps, primary, nil
}

// parsePrefixes parses CIDRs, masking host bits (10.0.0.1/8 is 10.0.0.0/8).
func parsePrefixes(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("invalid CIDR %q", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
