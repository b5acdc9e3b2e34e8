package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/proxier/conntrack"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// The apiVersion and kind of the configuration file.
const (
	ConfigAPIVersion = "nftproxy.io/v1alpha1"
	ConfigKind       = "NftproxyConfiguration"
)

// Configuration is the daemon's configuration as the --config file spells it. Every
// field has a flag of kube-proxy's name (given in each comment); a flag given on the
// command line overrides the file. The ruleset's fields (clusterCIDR, serviceCIDR,
// detectLocalMode, detectLocal.interfaceNamePrefix, nodePortAddresses, masqueradeAll,
// masqueradeBit, tableName) are ruleset.Options, inline, with its flags, defaults and
// validation, the same as nftrace's and the feature scenarios'. Durations are Go
// durations ("30s"). testdata/nftproxy.yaml is a commented example:
//
//	apiVersion: nftproxy.io/v1alpha1
//	kind: NftproxyConfiguration
//	hostnameOverride: node-a
//	clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
//	serviceCIDR: 10.96.0.0/12,fd00:10:96::/112
//	detectLocalMode: ClusterCIDR
//	nodePortAddresses: [192.168.0.0/24]
//	masqueradeAll: false
//	syncPeriod: 30s
//	minSyncPeriod: 1s
//	healthzBindAddress: 0.0.0.0:10256
//	metricsBindAddress: 127.0.0.1:10249
//	enableProfiling: false
//	tableName: nftproxy
//	verbosity: 2
type Configuration struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Kubeconfig is the kubeconfig file (--kubeconfig); empty with Master empty
	// means the in-cluster configuration.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Master is the API server's address, overriding the kubeconfig's (--master).
	Master string `json:"master,omitempty"`
	// HostnameOverride is this node's name (--hostname-override; default the
	// host name).
	HostnameOverride string `json:"hostnameOverride,omitempty"`
	// Options are the ruleset's fields, inline.
	ruleset.Options
	// SyncPeriod is the period of the full resync (--sync-period, default 30s).
	SyncPeriod string `json:"syncPeriod,omitempty"`
	// MinSyncPeriod is the least time between syncs (--min-sync-period, default 1s).
	MinSyncPeriod string `json:"minSyncPeriod,omitempty"`
	// HealthzBindAddress serves /healthz and /livez (--healthz-bind-address,
	// default 0.0.0.0:10256); empty disables it.
	HealthzBindAddress string `json:"healthzBindAddress,omitempty"`
	// MetricsBindAddress serves /metrics (--metrics-bind-address, default
	// 127.0.0.1:10249); empty disables it.
	MetricsBindAddress string `json:"metricsBindAddress,omitempty"`
	// EnableProfiling serves Go's profiling handlers under /debug/pprof/ on the
	// metrics address (--profiling, default false).
	EnableProfiling bool `json:"enableProfiling,omitempty"`
	// Verbosity is the log verbosity (-v): 0 and 1 log at info level, 2 and more
	// at debug level.
	Verbosity int `json:"verbosity,omitempty"`
	// Conntrack are the conntrack sysctls set at start (kube-proxy's conntrack).
	Conntrack ConntrackConfiguration `json:"conntrack,omitempty"`
	// proxyMode is kube-proxy's mode (its file's mode, --proxy-mode): nftables or
	// empty.
	proxyMode string
	// warnings are remarks on settings that are accepted and not applied (see
	// fromKubeProxy, kubeProxyOnly).
	warnings []string
}

// defaultConfiguration returns the configuration when neither file nor flags say
// anything.
func defaultConfiguration() Configuration {
	return Configuration{
		APIVersion: ConfigAPIVersion, Kind: ConfigKind,
		SyncPeriod:         "30s",
		MinSyncPeriod:      "1s",
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		Conntrack:          defaultConntrack(),
	}
}

// Options is the validated configuration the daemon runs with.
type Options struct {
	Kubeconfig string
	Master     string
	// NodeName is this node's name, lower case.
	NodeName      string
	Ruleset       ruleset.Config
	SyncPeriod    time.Duration
	MinSyncPeriod time.Duration
	// HealthzBindAddress and MetricsBindAddress are host:port, or empty when the
	// server is disabled.
	HealthzBindAddress string
	MetricsBindAddress string
	// EnableProfiling adds the profiling handlers to the metrics server.
	EnableProfiling bool
	// Conntrack are the conntrack sysctls to set at start.
	Conntrack conntrack.Sysctls
	// Cleanup asks to remove the tables and exit.
	Cleanup bool
	// CleanupAfterSync is a table of another proxy (kube-proxy's) to delete in both
	// families once every family has synced: taking a node over without a moment
	// without rules.
	CleanupAfterSync string
	// CleanupKubeProxyIptables asks to remove, at the same moment, the rules and
	// chains kube-proxy's iptables mode leaves (proxier/takeover).
	CleanupKubeProxyIptables bool
	// Version asks to print the version and exit; InitOnly to exit once the
	// configuration is checked (kube-proxy's --init-only).
	Version, InitOnly bool
	// ConfigWritten is the file --write-config-to wrote the configuration to; the
	// daemon then exits.
	ConfigWritten string
	LogLevel      slog.Level
	// Warnings are non-fatal remarks on the configuration, logged at start.
	Warnings []string
}

// commandFlags are the flags that exist only on the command line.
type commandFlags struct {
	config        string
	cleanup       bool
	cleanupAfter  string
	cleanupIpt    bool
	version       bool
	initOnly      bool
	writeConfigTo string
}

// newFlagSet returns the daemon's flags, bound to c and cf. The current values of c
// are the flags' defaults, so a flag set parsed over a loaded file changes only
// the fields whose flags are given.
func newFlagSet(c *Configuration, cf *commandFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("nftproxy", flag.ContinueOnError)
	fs.StringVar(&cf.config, "config", "", "configuration file (YAML, kind "+ConfigKind+"); flags given explicitly override it")
	fs.BoolVar(&cf.cleanup, "cleanup", false, "remove nftproxy's tables in both families and exit")
	fs.StringVar(&cf.cleanupAfter, "cleanup-table-after-sync", "", "once every family has synced, delete this table in both families (kube-proxy: kube-proxy's nftables-mode tables, when taking a node over from it)")
	fs.BoolVar(&cf.cleanupIpt, "cleanup-kube-proxy-iptables", false, "once every family has synced, remove the rules and chains kube-proxy's iptables mode leaves (iptables-nft and iptables-legacy, both families), as kube-proxy --cleanup does, when taking a node over from it")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig file; in-cluster configuration when neither it nor --master is given")
	fs.StringVar(&c.Master, "master", c.Master, "address of the Kubernetes API server (overrides the kubeconfig's)")
	fs.StringVar(&c.HostnameOverride, "hostname-override", c.HostnameOverride, "this node's name, instead of the host name")
	c.Options.AddFlags(fs)
	fs.StringVar(&c.SyncPeriod, "sync-period", c.SyncPeriod, "period of the full resync that repairs the tables")
	fs.StringVar(&c.MinSyncPeriod, "min-sync-period", c.MinSyncPeriod, "least time between two syncs")
	fs.StringVar(&c.HealthzBindAddress, "healthz-bind-address", c.HealthzBindAddress, "host:port of /healthz and /livez (empty disables)")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", c.MetricsBindAddress, "host:port of /metrics (empty disables)")
	fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "serve Go's profiling handlers under /debug/pprof/ on the metrics address")
	fs.IntVar(&c.Verbosity, "v", c.Verbosity, "log verbosity: 2 and more log at debug level")
	fs.BoolVar(&cf.version, "version", false, "print the version and exit")
	fs.BoolVar(&cf.initOnly, "init-only", false, "check the configuration and exit, as kube-proxy's init container does (nftproxy needs no privileged initialization)")
	fs.StringVar(&cf.writeConfigTo, "write-config-to", "", "write the effective configuration to this file and exit")
	c.Conntrack.addFlags(fs)
	addKubeProxyFlags(fs, c)
	return fs
}

// loadConfig parses the command line and the configuration file it names (flags
// given explicitly win), and validates the result. Every error names the field. It
// returns flag.ErrHelp when help was asked for, with the usage in the error's text.
func loadConfig(args []string) (*Options, error) {
	var usage bytes.Buffer
	var cf commandFlags
	probe := defaultConfiguration()
	fs := newFlagSet(&probe, &cf)
	fs.SetOutput(&usage)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, helpError{usage.String()}
		}
		return nil, fmt.Errorf("command line: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("command line: unexpected argument %q", fs.Arg(0))
	}
	cfg := defaultConfiguration()
	if cf.config != "" {
		if err := loadFile(cf.config, &cfg); err != nil {
			return nil, err
		}
	}
	// Parse again over the file's values: only the flags given change anything.
	fs = newFlagSet(&cfg, &cf)
	fs.SetOutput(&usage)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("command line: %w", err)
	}
	opts, err := cfg.options()
	if err != nil {
		return nil, err
	}
	opts.Cleanup, opts.Version, opts.InitOnly = cf.cleanup, cf.version, cf.initOnly
	if cf.cleanupAfter != "" && cf.cleanupAfter == opts.Ruleset.Table {
		return nil, fmt.Errorf("--cleanup-table-after-sync: %q is nftproxy's own table (--table-name)", cf.cleanupAfter)
	}
	opts.CleanupAfterSync, opts.CleanupKubeProxyIptables = cf.cleanupAfter, cf.cleanupIpt
	if cf.writeConfigTo != "" {
		if err := saveConfig(cf.writeConfigTo, cfg); err != nil {
			return nil, err
		}
		opts.ConfigWritten = cf.writeConfigTo
	}
	return opts, nil
}

// helpError carries the usage text when -h is given.
type helpError struct{ usage string }

func (e helpError) Error() string        { return e.usage }
func (e helpError) Is(target error) bool { return target == flag.ErrHelp }

// loadFile decodes the configuration file at path over cfg, strictly: an unknown,
// wrongly-cased or duplicate field is an error. The file is nftproxy's own kind or
// kube-proxy's KubeProxyConfiguration (see fromKubeProxy).
func loadFile(path string, cfg *Configuration) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	gvk, err := typeOf(data)
	if err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	switch {
	case gvk.Kind == KubeProxyKind && gvk.GroupVersion().String() == KubeProxyAPIVersion:
		err = fromKubeProxy(data, cfg)
	case gvk.Kind == ConfigKind && gvk.GroupVersion().String() == ConfigAPIVersion:
		err = ruleset.DecodeStrict(data, cfg)
	default:
		err = fmt.Errorf("apiVersion: %q, kind: %q: want %s %s, or kube-proxy's %s %s",
			gvk.GroupVersion(), gvk.Kind, ConfigAPIVersion, ConfigKind, KubeProxyAPIVersion, KubeProxyKind)
	}
	if err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// fieldError names a configuration field by its file name and its flag.
func fieldError(field, flagName, format string, args ...any) error {
	return fmt.Errorf("%s (--%s): %s", field, flagName, fmt.Sprintf(format, args...))
}

// options validates c and converts it to Options, reporting every invalid field.
func (c Configuration) options() (*Options, error) {
	var errs []error
	o := &Options{Kubeconfig: c.Kubeconfig, Master: c.Master, MetricsBindAddress: c.MetricsBindAddress, HealthzBindAddress: c.HealthzBindAddress,
		EnableProfiling: c.EnableProfiling}
	rc, warnings, err := c.Options.Config()
	if err != nil {
		errs = append(errs, err)
	}
	o.Ruleset, o.Warnings = rc, append(slices.Clone(c.warnings), warnings...)
	if o.SyncPeriod, err = parseDuration(c.SyncPeriod, false); err != nil {
		errs = append(errs, fieldError("syncPeriod", "sync-period", "%v", err))
	}
	if o.MinSyncPeriod, err = parseDuration(c.MinSyncPeriod, true); err != nil {
		errs = append(errs, fieldError("minSyncPeriod", "min-sync-period", "%v", err))
	}
	if o.Conntrack, err = c.Conntrack.sysctls(); err != nil {
		errs = append(errs, err)
	}
	if err := checkProxyMode(c.proxyMode); err != nil {
		errs = append(errs, err)
	}
	if err := checkBindAddress(c.HealthzBindAddress); err != nil {
		errs = append(errs, fieldError("healthzBindAddress", "healthz-bind-address", "%v", err))
	}
	if err := checkBindAddress(c.MetricsBindAddress); err != nil {
		errs = append(errs, fieldError("metricsBindAddress", "metrics-bind-address", "%v", err))
	}
	switch {
	case c.Verbosity < 0:
		errs = append(errs, fieldError("verbosity", "v", "%d: want 0 or more", c.Verbosity))
	case c.Verbosity >= 2:
		o.LogLevel = slog.LevelDebug
	}
	if o.NodeName, err = nodeName(c.HostnameOverride); err != nil {
		errs = append(errs, fieldError("hostnameOverride", "hostname-override", "%v", err))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid configuration: %w", errors.Join(errs...))
	}
	return o, nil
}

// parseDuration parses a positive duration (or zero, when zeroOK).
func parseDuration(s string, zeroOK bool) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (want e.g. 30s or 1m)", s)
	}
	if d < 0 || (d == 0 && !zeroOK) {
		return 0, fmt.Errorf("duration %q must be positive", s)
	}
	return d, nil
}

// checkBindAddress accepts "" (disabled) or host:port with an IP host (or none).
func checkBindAddress(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port", addr)
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("%q: host %q is not an IP address", addr, host)
		}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: invalid port %q", addr, port)
	}
	return nil
}

// nodeName returns override, or the host name, in lower case as Node names are.
func nodeName(override string) (string, error) {
	name := strings.ToLower(strings.TrimSpace(override))
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("no override and no host name: %w", err)
		}
		name = strings.ToLower(h)
	}
	return name, nil
}

// saveConfig writes cfg to path as nftproxy's own configuration kind, which
// --config reads back.
func saveConfig(path string, cfg Configuration) error {
	cfg.APIVersion, cfg.Kind = ConfigAPIVersion, ConfigKind
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("write-config-to: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write-config-to: %w", err)
	}
	return nil
}
