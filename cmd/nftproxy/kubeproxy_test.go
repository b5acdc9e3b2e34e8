package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/proxier/conntrack"
)

// kubeadmConfig is kube-proxy's configuration as kubeadm writes it.
func kubeadmConfig(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("testdata/kubeadm-kube-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// withField returns the kubeadm configuration with one top-level line replaced
// (or added when old is not there).
func withField(t *testing.T, old, repl string) string {
	t.Helper()
	cfg := kubeadmConfig(t)
	if old == "" {
		return cfg + repl + "\n"
	}
	if !strings.Contains(cfg, old) {
		t.Fatalf("the kubeadm configuration has no line %q", old)
	}
	return strings.Replace(cfg, old, repl, 1)
}

func TestKubeadmKubeProxyConfigurationLoads(t *testing.T) {
	o := mustLoad(t, "--hostname-override=node-a", "--config", writeConfig(t, kubeadmConfig(t)))
	if o.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" {
		t.Errorf("kubeconfig %q, want clientConnection.kubeconfig", o.Kubeconfig)
	}
	if !slices.Equal(o.Ruleset.ClusterCIDRs, prefixes("10.244.0.0/16")) {
		t.Errorf("cluster CIDRs %v, want clusterCIDR's 10.244.0.0/16", o.Ruleset.ClusterCIDRs)
	}
	// kubeadm's empty addresses and zero periods are kube-proxy's defaults.
	if o.HealthzBindAddress != "0.0.0.0:10256" || o.MetricsBindAddress != "127.0.0.1:10249" {
		t.Errorf("bind addresses %q and %q, want kube-proxy's defaults", o.HealthzBindAddress, o.MetricsBindAddress)
	}
	if o.SyncPeriod != 30*time.Second || o.MinSyncPeriod != time.Second {
		t.Errorf("sync periods %v and %v, want the defaults 30s and 1s", o.SyncPeriod, o.MinSyncPeriod)
	}
	for _, w := range o.Warnings {
		if strings.Contains(w, "not applied") {
			t.Errorf("kubeadm's zero values were reported: %s", w)
		}
	}
}

func TestKubeProxyFieldsMapped(t *testing.T) {
	cfg := kubeadmConfig(t)
	for old, repl := range map[string]string{
		"hostnameOverride: \"\"":      "hostnameOverride: Node-B",
		"healthzBindAddress: \"\"":    "healthzBindAddress: 127.0.0.1",
		"metricsBindAddress: \"\"":    "metricsBindAddress: 0.0.0.0:9999",
		"detectLocalMode: \"\"":       "detectLocalMode: InterfaceNamePrefix",
		"  interfaceNamePrefix: \"\"": "  interfaceNamePrefix: cali",
		"nodePortAddresses: null":     "nodePortAddresses: [192.168.0.0/24]",
		"  verbosity: 0":              "  verbosity: 4",
		"enableProfiling: false":      "enableProfiling: true",
		"nftables:\n  masqueradeAll: false\n  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s": "nftables:\n  masqueradeAll: true\n  masqueradeBit: 12\n  minSyncPeriod: 2s\n  syncPeriod: 1m",
	} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("the kubeadm configuration has no %q", old)
		}
		cfg = strings.Replace(cfg, old, repl, 1)
	}
	o := mustLoad(t, "--config", writeConfig(t, cfg))
	if o.NodeName != "node-b" {
		t.Errorf("node name %q, want hostnameOverride's, lower case", o.NodeName)
	}
	if o.HealthzBindAddress != "127.0.0.1:10256" || o.MetricsBindAddress != "0.0.0.0:9999" {
		t.Errorf("bind addresses %q and %q, want 127.0.0.1:10256 (kube-proxy's port added) and 0.0.0.0:9999", o.HealthzBindAddress, o.MetricsBindAddress)
	}
	if o.Ruleset.InterfacePrefix != "cali" || !o.Ruleset.MasqueradeAll || o.Ruleset.MasqueradeBit != 12 {
		t.Errorf("ruleset %+v: want interface prefix cali, masqueradeAll, mark bit 12", o.Ruleset)
	}
	if !slices.Equal(o.Ruleset.NodePortAddresses, prefixes("192.168.0.0/24")) {
		t.Errorf("node port addresses %v", o.Ruleset.NodePortAddresses)
	}
	if o.SyncPeriod != time.Minute || o.MinSyncPeriod != 2*time.Second {
		t.Errorf("sync periods %v and %v, want nftables' 1m and 2s", o.SyncPeriod, o.MinSyncPeriod)
	}
	if o.LogLevel >= 0 {
		t.Errorf("logging.verbosity 4 should log at debug level, got %v", o.LogLevel)
	}
	if !o.EnableProfiling {
		t.Errorf("enableProfiling: true was not applied")
	}
	// A flag still overrides the file.
	if o := mustLoad(t, "--config", writeConfig(t, cfg), "--hostname-override", "node-c"); o.NodeName != "node-c" {
		t.Errorf("--hostname-override did not override the file: %q", o.NodeName)
	}
}

func TestKubeProxyConfigurationErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		name, old, repl, want string
	}{
		{"another proxy mode", "mode: nftables", "mode: iptables", "mode (--proxy-mode): \"iptables\""},
		{"ipvs mode", "mode: nftables", "mode: ipvs", "mode (--proxy-mode)"},
		{"an unknown field", "", "clusterCIDRs: 10.0.0.0/8", `unknown field "clusterCIDRs"`},
		{"a wrongly-cased field", "clusterCIDR: 10.244.0.0/16", "clusterCidr: 10.244.0.0/16", `"clusterCidr"`},
		{"a bad CIDR", "clusterCIDR: 10.244.0.0/16", "clusterCIDR: 10.244.0.0/33", "clusterCIDR (--cluster-cidr)"},
		{"a bad healthz address", `healthzBindAddress: ""`, "healthzBindAddress: localhost", "healthzBindAddress (--healthz-bind-address)"},
		{"an unknown detector", `detectLocalMode: ""`, "detectLocalMode: NodeCidr", "detectLocalMode (--detect-local-mode)"},
		{"a detector without its setting", `detectLocalMode: ""`, "detectLocalMode: BridgeInterface", "detectLocal.bridgeInterface (--pod-bridge-interface): required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadConfig([]string{"--hostname-override=n", "--config", writeConfig(t, withField(t, c.old, c.repl))})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("want an error naming %q, got %v", c.want, err)
			}
		})
	}
}

func TestKubeProxySettingsNotAppliedAreReported(t *testing.T) {
	cfg := withField(t, "  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs:", "  masqueradeBit: 14\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs:")
	cfg = strings.Replace(cfg, "  maxPerCore: null", "  maxPerCore: 32768", 1)
	cfg += "featureGates: {MultiCIDRServiceAllocator: true}\n"
	o := mustLoad(t, "--hostname-override=n", "--config", writeConfig(t, cfg))
	joined := strings.Join(o.Warnings, "\n")
	if o.Conntrack.MaxPerCore != 32768 || o.Conntrack.Min != 131072 || o.Conntrack.TCPEstablishedTimeout != 24*time.Hour {
		t.Errorf("conntrack %+v: want maxPerCore 32768 and kube-proxy's defaults for kubeadm's nulls", o.Conntrack)
	}
	for _, want := range []string{"iptables section", "featureGates (MultiCIDRServiceAllocator=true)"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no warning about %s in:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "ipvs section") {
		t.Errorf("the untouched ipvs section was reported:\n%s", joined)
	}
}

func TestUnknownConfigKind(t *testing.T) {
	_, err := loadConfig([]string{"--config", writeConfig(t, "apiVersion: v1\nkind: ConfigMap\n")})
	if err == nil || !strings.Contains(err.Error(), KubeProxyKind) {
		t.Errorf("want an error naming the kinds --config reads, got %v", err)
	}
}

// kubeProxyFlags are every flag of kube-proxy v1.37 (cmd/kube-proxy/app/options.go
// and the logging flags it adds), each with a value kube-proxy accepts.
var kubeProxyFlags = []string{
	"--write-config-to=", "--cleanup=false", "--feature-gates=MultiCIDRServiceAllocator=true",
	"--kubeconfig=/etc/kubeconfig", "--master=https://192.168.0.1:6443", "--kube-api-content-type=application/json",
	"--kube-api-burst=20", "--kube-api-qps=10", "--hostname-override=node-a", "--bind-address=0.0.0.0",
	"--healthz-bind-address=0.0.0.0:10256", "--metrics-bind-address=127.0.0.1:10249", "--bind-address-hard-fail",
	"--profiling", "--show-hidden-metrics-for-version=1.36", "--init-only=false", "--proxy-mode=nftables",
	"--iptables-masquerade-bit=14", "--masquerade-all", "--iptables-localhost-nodeports=false",
	"--iptables-sync-period=45s", "--iptables-min-sync-period=2s", "--ipvs-sync-period=30s", "--ipvs-min-sync-period=1s",
	"--ipvs-scheduler=rr", "--ipvs-exclude-cidrs=10.0.0.0/8", "--ipvs-strict-arp", "--ipvs-tcp-timeout=0s",
	"--ipvs-tcpfin-timeout=0s", "--ipvs-udp-timeout=0s", "--detect-local-mode=ClusterCIDR", "--pod-bridge-interface=cbr0",
	"--pod-interface-name-prefix=veth", "--cluster-cidr=10.244.0.0/16", "--nodeport-addresses=192.168.0.0/24",
	"--oom-score-adj=-999", "--conntrack-max-per-core=0", "--conntrack-min=131072",
	"--conntrack-tcp-timeout-established=24h", "--conntrack-tcp-timeout-close-wait=1h", "--conntrack-tcp-be-liberal",
	"--conntrack-udp-timeout=30s", "--conntrack-udp-timeout-stream=120s", "--config-sync-period=15m",
	"--healthz-port=10256", "--metrics-port=10249", "-v=2", "--vmodule=proxier=4", "--logging-format=text",
	"--log-flush-frequency=5s", "--log-json-info-buffer-size=0", "--log-json-split-stream",
	"--log-text-info-buffer-size=0", "--log-text-split-stream",
}

func TestEveryKubeProxyFlagIsAccepted(t *testing.T) {
	o := mustLoad(t, kubeProxyFlags...)
	if o.SyncPeriod != 45*time.Second || o.MinSyncPeriod != 2*time.Second {
		t.Errorf("--iptables-sync-period and --iptables-min-sync-period gave %v and %v, want 45s and 2s (kube-proxy's nftables mode reads them)", o.SyncPeriod, o.MinSyncPeriod)
	}
	joined := strings.Join(o.Warnings, "\n")
	ct := o.Conntrack
	if ct.MaxPerCore != 0 || ct.Min != 131072 || ct.TCPEstablishedTimeout != 24*time.Hour || ct.TCPCloseWaitTimeout != time.Hour ||
		!ct.TCPBeLiberal || ct.UDPTimeout != 30*time.Second || ct.UDPStreamTimeout != 120*time.Second {
		t.Errorf("the --conntrack-* flags gave %+v", ct)
	}
	for _, want := range []string{"--ipvs-scheduler=rr is not applied", "--feature-gates=MultiCIDRServiceAllocator=true is not applied"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no warning %q in:\n%s", want, joined)
		}
	}
}

func TestKubeProxyFlags(t *testing.T) {
	if _, err := loadConfig([]string{"--hostname-override=n", "--proxy-mode=iptables"}); err == nil || !strings.Contains(err.Error(), "mode (--proxy-mode)") {
		t.Errorf("--proxy-mode=iptables: want an error naming the field, got %v", err)
	}
	o := mustLoad(t, "--hostname-override=n", "--healthz-port=12345", "--metrics-port=0")
	if o.HealthzBindAddress != "0.0.0.0:12345" || o.MetricsBindAddress != "" {
		t.Errorf("--healthz-port=12345 --metrics-port=0 gave %q and %q, want 0.0.0.0:12345 and disabled", o.HealthzBindAddress, o.MetricsBindAddress)
	}
	// A flag overrides the file's mode, as any flag does.
	file := writeConfig(t, withField(t, "mode: nftables", "mode: ipvs"))
	if _, err := loadConfig([]string{"--hostname-override=n", "--config", file, "--proxy-mode=nftables"}); err != nil {
		t.Errorf("--proxy-mode=nftables over a file's ipvs: %v", err)
	}
}

func TestWriteConfigToLoadsBack(t *testing.T) {
	out := filepath.Join(t.TempDir(), "written.yaml")
	var stderr bytes.Buffer
	args := []string{"--config", writeConfig(t, kubeadmConfig(t)), "--hostname-override=node-a", "--masquerade-all", "--write-config-to", out}
	if code := run(context.Background(), args, &stderr, deps{}); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := mustLoad(t, args[:len(args)-2]...)
	got := mustLoad(t, "--config", out)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the written configuration loads as\n%+v\nwant\n%+v", got, want)
	}
}

func TestVersionAndInitOnlyExit(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"--init-only", "--hostname-override=n"}} {
		var stderr bytes.Buffer
		// deps{} has no client: reaching the daemon would fail.
		if code := run(context.Background(), args, &stderr, deps{}); code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, stderr.String())
		}
		if args[0] == "--version" && !strings.HasPrefix(stderr.String(), "nftproxy ") {
			t.Errorf("--version printed %q", stderr.String())
		}
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"--init-only", "--proxy-mode=ipvs"}, &stderr, deps{}); code != 1 {
		t.Errorf("--init-only with a bad configuration: exit %d, want 1", code)
	}
}

func TestConntrackSettings(t *testing.T) {
	o := mustLoad(t, "--hostname-override=n")
	if o.Conntrack != conntrack.DefaultSysctls {
		t.Errorf("default conntrack settings %+v, want kube-proxy's %+v", o.Conntrack, conntrack.DefaultSysctls)
	}
	o = mustLoad(t, "--hostname-override=n", "--config", writeConfig(t, withField(t, "  udpTimeout: 0s", "  udpTimeout: 15s")))
	if o.Conntrack.UDPTimeout != 15*time.Second {
		t.Errorf("conntrack.udpTimeout 15s gave %v", o.Conntrack.UDPTimeout)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--conntrack-min=-1"}, "conntrack.min (--conntrack-min)"},
		{[]string{"--conntrack-udp-timeout=soon"}, "conntrack.udpTimeout (--conntrack-udp-timeout)"},
	} {
		_, err := loadConfig(append([]string{"--hostname-override=n"}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: want an error naming %q, got %v", c.args, c.want, err)
		}
	}
}

func TestSysctlsAtStart(t *testing.T) {
	var got []conntrack.Sysctls
	d := deps{sysctls: func(s conntrack.Sysctls) ([]string, error) {
		got = append(got, s)
		return []string{"nf_conntrack_udp_timeout=5"}, errors.New("nf_conntrack_max: read-only")
	}}
	var stderr bytes.Buffer
	// --init-only sets them and exits; a failure is its exit code.
	if code := run(context.Background(), []string{"--hostname-override=n", "--init-only", "--conntrack-udp-timeout=5s"}, &stderr, d); code != 1 {
		t.Errorf("--init-only with a sysctl that failed: exit %d, want 1\n%s", code, stderr.String())
	}
	if len(got) != 1 || got[0].UDPTimeout != 5*time.Second {
		t.Fatalf("sysctls applied %+v", got)
	}
	if !strings.Contains(stderr.String(), "nf_conntrack_udp_timeout=5") || !strings.Contains(stderr.String(), "read-only") {
		t.Errorf("the log does not show the change and the failure:\n%s", stderr.String())
	}
}
