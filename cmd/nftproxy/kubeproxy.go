package main

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// The apiVersion and kind of kube-proxy's configuration file, which --config also
// reads, so that kubeadm's kube-proxy ConfigMap serves nftproxy unchanged.
const (
	KubeProxyAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	KubeProxyKind       = "KubeProxyConfiguration"
)

// The ports kube-proxy serves on when its configuration names an address alone.
const (
	healthzPort = "10256"
	metricsPort = "10249"
)

// typeOf returns a configuration file's apiVersion and kind, read leniently: the
// strict decoding of the kind it names follows.
func typeOf(data []byte) (schema.GroupVersionKind, error) {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return schema.GroupVersionKind{}, err
	}
	return schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind), nil
}

// fromKubeProxy decodes kube-proxy's KubeProxyConfiguration strictly (an unknown,
// wrongly-cased or duplicate field is an error) and sets the fields of cfg it has,
// with kube-proxy's meanings: a zero value is kube-proxy's default, which is cfg's.
// What cannot apply to nftproxy (another proxy mode's section, Windows, settings
// not implemented) is accepted and reported in cfg's warnings; a mode other than
// nftables is an error (see checkProxyMode).
func fromKubeProxy(data []byte, cfg *Configuration) error {
	var kp kpconfig.KubeProxyConfiguration
	if err := ruleset.DecodeStrict(data, &kp); err != nil {
		return err
	}
	cfg.proxyMode = string(kp.Mode)
	cfg.Kubeconfig = kp.ClientConnection.Kubeconfig
	cfg.HostnameOverride = kp.HostnameOverride
	cfg.ClusterCIDR = kp.ClusterCIDR
	cfg.DetectLocalMode = string(kp.DetectLocalMode)
	cfg.DetectLocal.InterfaceNamePrefix = kp.DetectLocal.InterfaceNamePrefix
	cfg.DetectLocal.BridgeInterface = kp.DetectLocal.BridgeInterface
	cfg.NodePortAddresses = kp.NodePortAddresses
	// The mode's own section holds masquerading and the periods: nftables, or
	// iptables when the mode is empty, as that is the mode kube-proxy ran in.
	sec := modeSection{kp.NFTables.MasqueradeAll, kp.NFTables.MasqueradeBit, kp.NFTables.SyncPeriod.Duration, kp.NFTables.MinSyncPeriod.Duration}
	if kp.Mode == "" {
		sec = modeSection{kp.IPTables.MasqueradeAll, kp.IPTables.MasqueradeBit, kp.IPTables.SyncPeriod.Duration, kp.IPTables.MinSyncPeriod.Duration}
	}
	cfg.MasqueradeAll, cfg.MasqueradeBit = sec.masqueradeAll, sec.masqueradeBit
	if sec.syncPeriod != 0 {
		cfg.SyncPeriod = sec.syncPeriod.String()
	}
	if sec.minSyncPeriod != 0 {
		cfg.MinSyncPeriod = sec.minSyncPeriod.String()
	}
	var err error
	if cfg.HealthzBindAddress, err = kubeProxyBindAddress(kp.HealthzBindAddress, cfg.HealthzBindAddress, healthzPort); err != nil {
		return fieldError("healthzBindAddress", "healthz-bind-address", "%v", err)
	}
	if cfg.MetricsBindAddress, err = kubeProxyBindAddress(kp.MetricsBindAddress, cfg.MetricsBindAddress, metricsPort); err != nil {
		return fieldError("metricsBindAddress", "metrics-bind-address", "%v", err)
	}
	cfg.EnableProfiling = kp.EnableProfiling
	cfg.Verbosity = int(kp.Logging.Verbosity)
	fromKubeProxyConntrack(&kp.Conntrack, &cfg.Conntrack)
	cfg.warnings = append(cfg.warnings, notApplied(&kp)...)
	return nil
}

// modeSection is what nftproxy reads of the section of kube-proxy's mode.
type modeSection struct {
	masqueradeAll bool
	masqueradeBit *int32
	syncPeriod    time.Duration
	minSyncPeriod time.Duration
}

// fromKubeProxyConntrack sets the conntrack settings kp gives; nil (kubeadm's
// null) is kube-proxy's default, which is c's.
func fromKubeProxyConntrack(kp *kpconfig.KubeProxyConntrackConfiguration, c *ConntrackConfiguration) {
	if kp.MaxPerCore != nil {
		c.MaxPerCore = kp.MaxPerCore
	}
	if kp.Min != nil {
		c.Min = kp.Min
	}
	if kp.TCPEstablishedTimeout != nil {
		c.TCPEstablishedTimeout = kp.TCPEstablishedTimeout.Duration.String()
	}
	if kp.TCPCloseWaitTimeout != nil {
		c.TCPCloseWaitTimeout = kp.TCPCloseWaitTimeout.Duration.String()
	}
	c.TCPBeLiberal = kp.TCPBeLiberal
	if d := kp.UDPTimeout.Duration; d != 0 {
		c.UDPTimeout = d.String()
	}
	if d := kp.UDPStreamTimeout.Duration; d != 0 {
		c.UDPStreamTimeout = d.String()
	}
}

// kubeProxyBindAddress turns a kube-proxy bind address into the daemon's: empty is
// kube-proxy's default (dflt), and an address without a port gets port.
func kubeProxyBindAddress(addr, dflt, port string) (string, error) {
	if addr == "" {
		return dflt, nil
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr, nil
	}
	if net.ParseIP(addr) == nil {
		return "", fmt.Errorf("%q: want an IP address, or IP:port", addr)
	}
	return net.JoinHostPort(addr, port), nil
}

// notApplied lists the settings of kp that nftproxy accepts and does not apply,
// each with the reason, in the order of kube-proxy's fields. Zero values, which
// kubeadm writes for every field, are not reported.
func notApplied(kp *kpconfig.KubeProxyConfiguration) []string {
	var out []string
	add := func(set bool, field, why string) {
		if set {
			out = append(out, fmt.Sprintf("kube-proxy's %s is not applied: %s", field, why))
		}
	}
	if len(kp.FeatureGates) > 0 {
		var gates []string
		for g, on := range kp.FeatureGates {
			gates = append(gates, g+"="+strconv.FormatBool(on))
		}
		slices.Sort(gates)
		add(true, "featureGates ("+strings.Join(gates, ",")+")", "nftproxy implements the GA behaviour of kube-proxy v1.37 and has no gates")
	}
	cc := kp.ClientConnection
	add(cc.QPS != 0 || cc.Burst != 0 || cc.ContentType != "" || cc.AcceptContentTypes != "",
		"clientConnection.qps/burst/contentType", "nftproxy's client uses client-go's defaults")
	add(kp.BindAddressHardFail, "bindAddressHardFail", "a server that cannot bind always stops the daemon")
	add(kp.ShowHiddenMetricsForVersion != "", "showHiddenMetricsForVersion", "nftproxy hides no metrics")
	ipt, nft := kp.IPTables, kp.NFTables
	if kp.Mode == "" {
		add(nft.MasqueradeBit != nil || nft.MasqueradeAll || nft.SyncPeriod.Duration != 0 || nft.MinSyncPeriod.Duration != 0,
			"nftables section", "mode is empty, kube-proxy's iptables mode, whose section nftproxy reads")
	} else {
		add(ipt.MasqueradeBit != nil || ipt.MasqueradeAll || ipt.SyncPeriod.Duration != 0 || ipt.MinSyncPeriod.Duration != 0,
			"iptables section", "it configures kube-proxy's iptables mode; nftproxy reads the nftables section")
	}
	add(ipt.LocalhostNodePorts != nil && *ipt.LocalhostNodePorts, "iptables.localhostNodePorts",
		"NodePorts are never served on localhost, as in kube-proxy's nftables mode")
	ipvs := kp.IPVS
	add(ipvs.SyncPeriod.Duration != 0 || ipvs.MinSyncPeriod.Duration != 0 || ipvs.Scheduler != "" || len(ipvs.ExcludeCIDRs) > 0 ||
		ipvs.StrictARP || ipvs.TCPTimeout.Duration != 0 || ipvs.TCPFinTimeout.Duration != 0 || ipvs.UDPTimeout.Duration != 0,
		"ipvs section", "it configures kube-proxy's ipvs mode")
	wk := kp.Winkernel
	add(wk.NetworkName != "" || wk.SourceVip != "" || wk.EnableDSR || wk.RootHnsEndpointName != "" || wk.ForwardHealthCheckVip || kp.WindowsRunAsService,
		"winkernel section and windowsRunAsService", "they apply to Windows nodes")
	add(kp.DetectLocal.BridgeInterface != "" && kp.DetectLocalMode != "BridgeInterface",
		"detectLocal.bridgeInterface", "detectLocalMode is not BridgeInterface")
	add(kp.OOMScoreAdj != nil, "oomScoreAdj", "set the Pod's resources or the container runtime's OOM score instead")
	add(kp.ConfigSyncPeriod.Duration != 0, "configSyncPeriod", "nftproxy's informers do not resync; its own periodic full sync is syncPeriod")
	add(kp.PortRange != "", "portRange", "kube-proxy ignores it too")
	return out
}
