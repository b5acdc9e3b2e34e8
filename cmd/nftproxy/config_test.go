package main

import (
	"errors"
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustLoad(t *testing.T, args ...string) *Options {
	t.Helper()
	o, err := loadConfig(args)
	if err != nil {
		t.Fatalf("loadConfig(%q): %v", args, err)
	}
	return o
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestDefaults(t *testing.T) {
	o := mustLoad(t, "--hostname-override", "Node-A")
	if o.NodeName != "node-a" {
		t.Errorf("node name = %q, want the override in lower case", o.NodeName)
	}
	if o.SyncPeriod != 30*time.Second || o.MinSyncPeriod != time.Second {
		t.Errorf("sync periods = %v, %v; want 30s, 1s", o.SyncPeriod, o.MinSyncPeriod)
	}
	if o.HealthzBindAddress != "0.0.0.0:10256" || o.MetricsBindAddress != "127.0.0.1:10249" {
		t.Errorf("bind addresses = %q, %q", o.HealthzBindAddress, o.MetricsBindAddress)
	}
	if o.Ruleset.Table != "nftproxy" || o.Ruleset.MasqueradeBit != ruleset.DefaultMasqueradeBit {
		t.Errorf("ruleset config = %+v", o.Ruleset)
	}
	// ClusterCIDR mode without a cluster CIDR detects nothing, with a warning.
	if o.Ruleset.LocalMode != ruleset.LocalNone || len(o.Warnings) != 1 {
		t.Errorf("local mode %q, warnings %q; want none and one warning", o.Ruleset.LocalMode, o.Warnings)
	}
	if o.LogLevel != slog.LevelInfo || o.Cleanup || o.EnableProfiling {
		t.Errorf("log level %v, cleanup %v, profiling %v", o.LogLevel, o.Cleanup, o.EnableProfiling)
	}
}

func TestFlags(t *testing.T) {
	o := mustLoad(t,
		"--hostname-override=n1", "--cluster-cidr=10.0.0.0/8, fd01::/48", "--service-cidr=172.30.0.0/16",
		"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth",
		"--nodeport-addresses=192.168.0.0/24,10.0.0.1/8", "--masquerade-all",
		"--sync-period=1m", "--min-sync-period=0s", "--healthz-bind-address=", "--metrics-bind-address=[::1]:9999",
		"--table-name=kp", "-v=4", "--kubeconfig=/etc/kc", "--master=https://api:6443", "--cleanup", "--profiling")
	rc := o.Ruleset
	if !slices.Equal(rc.ClusterCIDRs, prefixes("10.0.0.0/8", "fd01::/48")) ||
		!slices.Equal(rc.ServiceCIDRs, prefixes("172.30.0.0/16")) ||
		!slices.Equal(rc.NodePortAddresses, prefixes("192.168.0.0/24", "10.0.0.0/8")) {
		t.Errorf("CIDRs = %v / %v / %v", rc.ClusterCIDRs, rc.ServiceCIDRs, rc.NodePortAddresses)
	}
	if rc.LocalMode != ruleset.LocalInterfacePrefix || rc.InterfacePrefix != "veth" || !rc.MasqueradeAll || rc.Table != "kp" {
		t.Errorf("ruleset config = %+v", rc)
	}
	if o.SyncPeriod != time.Minute || o.MinSyncPeriod != 0 || o.HealthzBindAddress != "" || o.MetricsBindAddress != "[::1]:9999" {
		t.Errorf("options = %+v", o)
	}
	if o.LogLevel != slog.LevelDebug || !o.Cleanup || o.Kubeconfig != "/etc/kc" || o.Master != "https://api:6443" || !o.EnableProfiling {
		t.Errorf("options = %+v", o)
	}
}

func TestFileAndFlagPrecedence(t *testing.T) {
	path := writeConfig(t, `
apiVersion: nftproxy.io/v1alpha1
kind: NftproxyConfiguration
hostnameOverride: from-file
clusterCIDR: 10.0.0.0/8
syncPeriod: 10s
minSyncPeriod: 2s
masqueradeAll: true
nodePortAddresses: [192.168.0.0/24]
tableName: filetable
`)
	o := mustLoad(t, "--config", path, "--sync-period=20s", "--masquerade-all=false", "--nodeport-addresses=10.1.0.0/16")
	if o.SyncPeriod != 20*time.Second {
		t.Errorf("sync period = %v, want the flag's 20s", o.SyncPeriod)
	}
	if o.MinSyncPeriod != 2*time.Second {
		t.Errorf("min sync period = %v, want the file's 2s", o.MinSyncPeriod)
	}
	if o.Ruleset.MasqueradeAll {
		t.Errorf("masqueradeAll = true, want the flag's false")
	}
	if !slices.Equal(o.Ruleset.NodePortAddresses, prefixes("10.1.0.0/16")) {
		t.Errorf("nodePortAddresses = %v, want the flag's", o.Ruleset.NodePortAddresses)
	}
	if o.NodeName != "from-file" || o.Ruleset.Table != "filetable" || o.Ruleset.LocalMode != ruleset.LocalClusterCIDR {
		t.Errorf("file values lost: node %q table %q mode %q", o.NodeName, o.Ruleset.Table, o.Ruleset.LocalMode)
	}
	if o.HealthzBindAddress != "0.0.0.0:10256" {
		t.Errorf("healthz address = %q, want the default", o.HealthzBindAddress)
	}
	// The flag may come before --config and still wins.
	if o := mustLoad(t, "--table-name=flagtable", "--config="+path); o.Ruleset.Table != "flagtable" {
		t.Errorf("table = %q, want the flag's even when given before --config", o.Ruleset.Table)
	}
}

func TestBadConfigNamesTheField(t *testing.T) {
	header := "apiVersion: nftproxy.io/v1alpha1\nkind: NftproxyConfiguration\n"
	cases := []struct {
		name string
		file string // config file body, if any
		args []string
		want []string
	}{
		{"unknown field", header + "syncPeriodd: 10s\n", nil, []string{`unknown field "syncPeriodd"`}},
		{"duplicate field", header + "syncPeriod: 10s\nsyncPeriod: 20s\n", nil, []string{"syncPeriod"}},
		{"wrong type", header + "masqueradeAll: maybe\n", nil, []string{"masqueradeAll"}},
		{"wrong kind", "apiVersion: nftproxy.io/v1alpha1\nkind: KubeProxyConfiguration\n", nil, []string{"kind:", "KubeProxyConfiguration"}},
		{"wrong apiVersion", "apiVersion: v1\nkind: NftproxyConfiguration\n", nil, []string{"apiVersion:"}},
		{"bad CIDR in file", header + "clusterCIDR: 10.0.0.0/33\n", nil, []string{`clusterCIDR (--cluster-cidr): invalid CIDR "10.0.0.0/33"`}},
		{"bad CIDR flag", "", []string{"--service-cidr=172.30.0.0/16,nonsense"}, []string{`serviceCIDR (--service-cidr): invalid CIDR "nonsense"`}},
		{"bad nodeport address", "", []string{"--nodeport-addresses=primry"}, []string{`nodePortAddresses (--nodeport-addresses): invalid CIDR "primry"`}},
		{"bad mode", "", []string{"--detect-local-mode=NodeCidr"}, []string{`detectLocalMode (--detect-local-mode): "NodeCidr"`}},
		{"missing bridge", "", []string{"--detect-local-mode=BridgeInterface"}, []string{"detectLocal.bridgeInterface (--pod-bridge-interface): required"}},
		{"missing prefix", "", []string{"--detect-local-mode=InterfaceNamePrefix"}, []string{"detectLocal.interfaceNamePrefix (--pod-interface-name-prefix): required"}},
		{"bad duration", header + "syncPeriod: soon\n", nil, []string{`syncPeriod (--sync-period): invalid duration "soon"`}},
		{"zero sync period", "", []string{"--sync-period=0s"}, []string{"syncPeriod (--sync-period)", "positive"}},
		{"negative min sync period", "", []string{"--min-sync-period=-1s"}, []string{"minSyncPeriod (--min-sync-period)"}},
		{"bad bind address", "", []string{"--metrics-bind-address=localhost"}, []string{"metricsBindAddress (--metrics-bind-address)"}},
		{"bad bind host", "", []string{"--healthz-bind-address=example.com:10256"}, []string{"healthzBindAddress (--healthz-bind-address)", "not an IP"}},
		{"unknown flag", "", []string{"--proxy-mode=iptables"}, []string{"proxy-mode"}},
		{"missing file", "", []string{"--config=/nonexistent/nftproxy.yaml"}, []string{"config file", "/nonexistent/nftproxy.yaml"}},
		{"several errors at once", "", []string{"--cluster-cidr=x", "--sync-period=y"}, []string{"clusterCIDR", "syncPeriod"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--hostname-override=n"}, c.args...)
			if c.file != "" {
				args = append(args, "--config", writeConfig(t, c.file))
			}
			_, err := loadConfig(args)
			if err == nil {
				t.Fatalf("loadConfig(%q) accepted the configuration", args)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestHelp(t *testing.T) {
	_, err := loadConfig([]string{"-h"})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: err = %v, want flag.ErrHelp", err)
	}
	for _, name := range []string{"-cluster-cidr", "-detect-local-mode", "-sync-period", "-healthz-bind-address", "-cleanup", "-config"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("usage lacks %s", name)
		}
	}
}

func TestExampleConfigLoads(t *testing.T) {
	o := mustLoad(t, "--config", "testdata/nftproxy.yaml")
	if o.NodeName != "node-a" || o.Ruleset.LocalMode != ruleset.LocalClusterCIDR || len(o.Ruleset.ClusterCIDRs) != 2 ||
		len(o.Ruleset.ServiceCIDRs) != 2 || o.LogLevel != slog.LevelDebug {
		t.Errorf("example config gives %+v", o)
	}
}

// rulesetFragment sets every ruleset field; rulesetFlags are the same settings as
// flags.
const rulesetFragment = `clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
serviceCIDR: 10.96.0.0/12
detectLocalMode: InterfaceNamePrefix
detectLocal: {interfaceNamePrefix: cali}
nodePortAddresses: [192.168.0.0/24]
masqueradeAll: true
masqueradeBit: 9
tableName: kp
`

var rulesetFlags = []string{"--cluster-cidr=10.244.0.0/16,fd00:10:244::/56", "--service-cidr=10.96.0.0/12",
	"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=cali", "--nodeport-addresses=192.168.0.0/24",
	"--masquerade-all", "--iptables-masquerade-bit=9", "--table-name=kp"}

// TestRulesetConfigIsOptions: the daemon's file and flags give the Config that
// ruleset.Options gives for the same settings, the one nftrace and the feature
// scenarios use.
func TestRulesetConfigIsOptions(t *testing.T) {
	ro, err := ruleset.DecodeOptions([]byte(rulesetFragment))
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := ro.Config()
	if err != nil {
		t.Fatal(err)
	}
	if want.LocalMode != ruleset.LocalInterfacePrefix || want.InterfacePrefix != "cali" || want.MasqueradeBit != 9 {
		t.Fatalf("ruleset.Options gives %+v", want)
	}
	fromFile := mustLoad(t, "--hostname-override=n", "--config", writeConfig(t, "apiVersion: nftproxy.io/v1alpha1\nkind: NftproxyConfiguration\n"+rulesetFragment))
	fromFlags := mustLoad(t, append([]string{"--hostname-override=n"}, rulesetFlags...)...)
	for name, o := range map[string]*Options{"file": fromFile, "flags": fromFlags} {
		if !reflect.DeepEqual(o.Ruleset, want) {
			t.Errorf("%s: ruleset config %+v, want %+v", name, o.Ruleset, want)
		}
		if len(o.Warnings) != 0 {
			t.Errorf("%s: warnings %q, want none", name, o.Warnings)
		}
	}
}

func TestUnsetCIDRsWarning(t *testing.T) {
	o := mustLoad(t, "--hostname-override=n")
	if len(o.Warnings) != 1 || !strings.Contains(o.Warnings[0], "clusterCIDR") || !strings.Contains(o.Warnings[0], "serviceCIDR") {
		t.Errorf("warnings %q, want one naming clusterCIDR and serviceCIDR", o.Warnings)
	}
	o = mustLoad(t, "--hostname-override=n", "--cluster-cidr=10.0.0.0/8")
	if o.Ruleset.LocalMode != ruleset.LocalClusterCIDR || len(o.Warnings) != 1 || strings.Contains(o.Warnings[0], "clusterCIDR") {
		t.Errorf("with a cluster CIDR: mode %q, warnings %q; want ClusterCIDR and a warning on serviceCIDR only", o.Ruleset.LocalMode, o.Warnings)
	}
}

func TestFileFieldsAreCaseSensitive(t *testing.T) {
	header := "apiVersion: nftproxy.io/v1alpha1\nkind: NftproxyConfiguration\n"
	for body, want := range map[string]string{
		"ClusterCIDR: 10.0.0.0/8\n":               `unknown field "ClusterCIDR"`,
		"syncperiod: 10s\n":                       `unknown field "syncperiod"`,
		"detectLocal: {interfacenameprefix: x}\n": `unknown field "detectLocal.interfacenameprefix"`,
		"podInterfaceNamePrefix: cali\n":          `unknown field "podInterfaceNamePrefix"`,
	} {
		_, err := loadConfig([]string{"--hostname-override=n", "--config", writeConfig(t, header+body)})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %s", body, err, want)
		}
	}
}
