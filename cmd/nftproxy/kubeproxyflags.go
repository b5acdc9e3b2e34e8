package main

import (
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// kubeProxyOnly are kube-proxy v1.37's flags that nftproxy accepts so that its
// command line serves unchanged, and does not apply, each with the reason given in
// the warning logged at start when it is set.
var kubeProxyOnly = []struct {
	name, why string
	isBool    bool
}{
	{"feature-gates", "nftproxy implements the GA behaviour of kube-proxy v1.37 and has no gates", false},
	{"kube-api-content-type", "nftproxy's client uses client-go's defaults", false},
	{"kube-api-burst", "nftproxy's client uses client-go's defaults", false},
	{"kube-api-qps", "nftproxy's client uses client-go's defaults", false},
	{"bind-address", "nftproxy serves both families whatever the node's primary one", false},
	{"bind-address-hard-fail", "a server that cannot bind always stops the daemon", true},
	{"show-hidden-metrics-for-version", "nftproxy hides no metrics", false},
	{"iptables-localhost-nodeports", "it applies to kube-proxy's iptables mode; NodePorts are never served on localhost, as in kube-proxy's nftables mode", true},
	{"ipvs-sync-period", "it applies to kube-proxy's ipvs mode", false},
	{"ipvs-min-sync-period", "it applies to kube-proxy's ipvs mode", false},
	{"ipvs-scheduler", "it applies to kube-proxy's ipvs mode", false},
	{"ipvs-exclude-cidrs", "it applies to kube-proxy's ipvs mode", false},
	{"ipvs-strict-arp", "it applies to kube-proxy's ipvs mode", true},
	{"ipvs-tcp-timeout", "it applies to kube-proxy's ipvs mode", false},
	{"ipvs-tcpfin-timeout", "it applies to kube-proxy's ipvs mode", false},
	{"ipvs-udp-timeout", "it applies to kube-proxy's ipvs mode", false},
	{"oom-score-adj", "set the Pod's resources or the container runtime's OOM score instead", false},
	{"config-sync-period", "nftproxy's informers do not resync; its own periodic full sync is --sync-period", false},
	{"vmodule", "nftproxy logs through log/slog; -v sets the level", false},
	{"logging-format", "nftproxy logs text", false},
	{"log-flush-frequency", "nftproxy's logs are not buffered", false},
	{"log-json-info-buffer-size", "nftproxy logs text", false},
	{"log-json-split-stream", "nftproxy logs text", true},
	{"log-text-info-buffer-size", "nftproxy's logs are not buffered", false},
	{"log-text-split-stream", "nftproxy logs to stderr only", true},
}

// ignoredFlag is a kube-proxy flag nftproxy accepts without applying it: setting it
// adds a warning.
type ignoredFlag struct {
	name, why string
	isBool    bool
	warnings  *[]string
}

func (f *ignoredFlag) String() string   { return "" }
func (f *ignoredFlag) IsBoolFlag() bool { return f.isBool }

func (f *ignoredFlag) Set(v string) error {
	*f.warnings = append(*f.warnings, fmt.Sprintf("kube-proxy's --%s=%s is not applied: %s", f.name, v, f.why))
	return nil
}

// addKubeProxyFlags registers the kube-proxy flags of c that nftproxy has under
// kube-proxy's own names only (--proxy-mode, the iptables sync periods, the
// deprecated port flags), and those it accepts without applying.
func addKubeProxyFlags(fs *flag.FlagSet, c *Configuration) {
	fs.StringVar(&c.proxyMode, "proxy-mode", c.proxyMode, "kube-proxy's mode: nftables, or empty; nftproxy implements kube-proxy's nftables mode only")
	// kube-proxy's nftables mode takes its periods from the iptables flags.
	fs.Func("iptables-sync-period", "kube-proxy's name of --sync-period", func(v string) error {
		c.SyncPeriod = v
		return nil
	})
	fs.Func("iptables-min-sync-period", "kube-proxy's name of --min-sync-period", func(v string) error {
		c.MinSyncPeriod = v
		return nil
	})
	fs.Func("healthz-port", "deprecated in kube-proxy: the port of --healthz-bind-address", func(v string) error {
		return setPort(&c.HealthzBindAddress, v, "0.0.0.0")
	})
	fs.Func("metrics-port", "deprecated in kube-proxy: the port of --metrics-bind-address", func(v string) error {
		return setPort(&c.MetricsBindAddress, v, "127.0.0.1")
	})
	for _, k := range kubeProxyOnly {
		usage := "kube-proxy's flag, accepted and not applied: " + k.why
		fs.Var(&ignoredFlag{name: k.name, why: k.why, isBool: k.isBool, warnings: &c.warnings}, k.name, usage)
	}
}

// setPort sets the port of the bind address *addr (host when it has none); 0
// disables the server, as in kube-proxy.
func setPort(addr *string, port, host string) error {
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("invalid port %q", port)
	}
	if n == 0 {
		*addr = ""
		return nil
	}
	if h, _, err := net.SplitHostPort(*addr); err == nil {
		host = h
	}
	*addr = net.JoinHostPort(host, port)
	return nil
}

// checkProxyMode accepts kube-proxy's nftables mode (or none).
func checkProxyMode(mode string) error {
	switch strings.TrimSpace(mode) {
	case "", "nftables":
		return nil
	}
	return fieldError("mode", "proxy-mode", "%q: nftproxy implements kube-proxy's nftables mode; set nftables or leave it empty", mode)
}
