package ruleset

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var cmpPrefix = cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })

func mustPrefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// everyFieldYAML, everyFieldJSON and everyFieldFlags set every field of Options;
// all three give everyFieldConfig.
const everyFieldYAML = `
clusterCIDR: 10.244.0.0/16, fd00:10:244::/56
serviceCIDR: 10.96.0.0/12,fd00:10:96::/112
detectLocalMode: InterfaceNamePrefix
detectLocal:
  interfaceNamePrefix: veth
  bridgeInterface: cbr0
nodePortAddresses: [192.168.0.0/24, 10.0.0.1/8]
masqueradeAll: true
masqueradeBit: 5
tableName: kp
`

const everyFieldJSON = `{"clusterCIDR": "10.244.0.0/16, fd00:10:244::/56", "serviceCIDR": "10.96.0.0/12,fd00:10:96::/112",
 "detectLocalMode": "InterfaceNamePrefix", "detectLocal": {"interfaceNamePrefix": "veth", "bridgeInterface": "cbr0"},
 "nodePortAddresses": ["192.168.0.0/24", "10.0.0.1/8"], "masqueradeAll": true, "masqueradeBit": 5, "tableName": "kp"}`

var everyFieldFlags = []string{
	"--cluster-cidr=10.244.0.0/16, fd00:10:244::/56", "--service-cidr=10.96.0.0/12,fd00:10:96::/112",
	"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth", "--pod-bridge-interface=cbr0",
	"--nodeport-addresses=192.168.0.0/24,10.0.0.1/8", "--masquerade-all", "--iptables-masquerade-bit=5", "--table-name=kp",
}

var everyFieldConfig = Config{
	Table:             "kp",
	LocalMode:         LocalInterfacePrefix,
	ClusterCIDRs:      mustPrefixes("10.244.0.0/16", "fd00:10:244::/56"),
	InterfacePrefix:   "veth",
	BridgeInterface:   "cbr0",
	MasqueradeAll:     true,
	MasqueradeBit:     5,
	NodePortAddresses: mustPrefixes("192.168.0.0/24", "10.0.0.0/8"), // host bits masked
	ServiceCIDRs:      mustPrefixes("10.96.0.0/12", "fd00:10:96::/112"),
}

func mustConfig(t *testing.T, o Options) (Config, []string) {
	t.Helper()
	c, warnings, err := o.Config()
	if err != nil {
		t.Fatalf("Config(%+v): %v", o, err)
	}
	return c, warnings
}

func TestOptionsEveryField(t *testing.T) {
	for name, doc := range map[string]string{"yaml": everyFieldYAML, "json": everyFieldJSON} {
		o, err := DecodeOptions([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c, warnings := mustConfig(t, o)
		if diff := cmp.Diff(everyFieldConfig, c, cmpPrefix); diff != "" {
			t.Errorf("%s: Config (-want +got):\n%s", name, diff)
		}
		if len(warnings) != 0 {
			t.Errorf("%s: warnings %q, want none when everything is set", name, warnings)
		}
	}
}

func TestOptionsFlags(t *testing.T) {
	var o Options
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(everyFieldFlags); err != nil {
		t.Fatal(err)
	}
	fromFile, err := DecodeOptions([]byte(everyFieldYAML))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := mustConfig(t, o)
	if diff := cmp.Diff(everyFieldConfig, c, cmpPrefix); diff != "" {
		t.Errorf("flags: Config (-want +got):\n%s", diff)
	}
	file, _ := mustConfig(t, fromFile)
	if diff := cmp.Diff(file, c, cmpPrefix); diff != "" {
		t.Errorf("flags and file differ (-file +flags):\n%s", diff)
	}
}

// TestOptionsFlagsOverFile: flags registered over loaded Options keep the file's
// values as defaults, so only the flags given change anything.
func TestOptionsFlagsOverFile(t *testing.T) {
	o, err := DecodeOptions([]byte(everyFieldYAML))
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--table-name=other", "--nodeport-addresses=10.1.0.0/16", "--masquerade-all=false"}); err != nil {
		t.Fatal(err)
	}
	c, _ := mustConfig(t, o)
	want := everyFieldConfig
	want.Table, want.NodePortAddresses, want.MasqueradeAll = "other", mustPrefixes("10.1.0.0/16"), false
	if diff := cmp.Diff(want, c, cmpPrefix); diff != "" {
		t.Errorf("Config (-want +got):\n%s", diff)
	}
}

// TestOptionsBridgeInterface: detectLocal.bridgeInterface is read from the file,
// and kept whatever the mode, as kube-proxy keeps it.
func TestOptionsBridgeInterface(t *testing.T) {
	for doc, mode := range map[string]LocalMode{
		"detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n":                     LocalBridgeInterface,
		"detectLocalMode: NodeCIDR\ndetectLocal: {bridgeInterface: cbr0, interfaceNamePrefix: veth}\n": LocalNodeCIDR,
	} {
		o, err := DecodeOptions([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		c, _ := mustConfig(t, o)
		if c.LocalMode != mode || c.BridgeInterface != "cbr0" {
			t.Errorf("%q: mode %q, bridge %q; want %q, cbr0", doc, c.LocalMode, c.BridgeInterface, mode)
		}
	}
}

// TestOptionsNodePortKeywords: nodePortAddresses takes kube-proxy's keywords primary
// and all, alone or with CIDRs, in the file and as flags.
func TestOptionsNodePortKeywords(t *testing.T) {
	all := mustPrefixes("0.0.0.0/0", "::/0")
	for _, tc := range []struct {
		list    string
		primary bool
		want    []netip.Prefix
	}{
		{"primary", true, nil},
		{"all", false, all},
		{"primary,192.168.0.0/24", true, mustPrefixes("192.168.0.0/24")},
		{"fd00::/8,all,primary", true, append(mustPrefixes("fd00::/8"), all...)},
		{"", false, nil},
	} {
		doc := "nodePortAddresses: [" + tc.list + "]\n"
		fromFile, err := DecodeOptions([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		var fromFlags Options
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fromFlags.AddFlags(fs)
		if err := fs.Parse([]string{"--nodeport-addresses=" + tc.list}); err != nil {
			t.Fatal(err)
		}
		for name, o := range map[string]Options{"file": fromFile, "flags": fromFlags} {
			c, _ := mustConfig(t, o)
			if c.NodePortPrimary != tc.primary || !cmp.Equal(c.NodePortAddresses, tc.want, cmpPrefix) {
				t.Errorf("%s %q: primary %v, prefixes %v; want %v, %v", name, tc.list, c.NodePortPrimary, c.NodePortAddresses, tc.primary, tc.want)
			}
		}
	}
}

func TestOptionsFlagNames(t *testing.T) {
	var o Options
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.AddFlags(fs)
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.PrintDefaults()
	for _, name := range []string{"cluster-cidr", "service-cidr", "detect-local-mode", "pod-interface-name-prefix", "pod-bridge-interface",
		"nodeport-addresses", "masquerade-all", "iptables-masquerade-bit", "table-name"} {
		if fs.Lookup(name) == nil || !strings.Contains(help.String(), "-"+name) {
			t.Errorf("flag --%s missing", name)
		}
	}
	if err := fs.Parse([]string{"--iptables-masquerade-bit=x"}); err == nil {
		t.Errorf("--iptables-masquerade-bit=x accepted")
	}
}

func TestOptionsDefaults(t *testing.T) {
	cases := []struct {
		name     string
		doc      string
		mode     LocalMode
		warnings []string // substrings of the one warning; none when empty
	}{
		{"nothing set", "", LocalNone, []string{"clusterCIDR", "no traffic as pod traffic", "serviceCIDR", "not dropped"}},
		{"explicit ClusterCIDR without CIDR", "detectLocalMode: ClusterCIDR\nserviceCIDR: 172.30.0.0/16\n", LocalNone, []string{"clusterCIDR"}},
		{"blank clusterCIDR", "clusterCIDR: ' , '\nserviceCIDR: 172.30.0.0/16\n", LocalNone, []string{"clusterCIDR"}},
		{"no serviceCIDR", "clusterCIDR: 10.0.0.0/8\n", LocalClusterCIDR, []string{"serviceCIDR"}},
		{"both", "clusterCIDR: 10.0.0.0/8\nserviceCIDR: 172.30.0.0/16\n", LocalClusterCIDR, nil},
		{"BridgeInterface needs no clusterCIDR", "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\nserviceCIDR: 172.30.0.0/16\n", LocalBridgeInterface, nil},
		{"NodeCIDR needs no clusterCIDR", "detectLocalMode: NodeCIDR\nserviceCIDR: 172.30.0.0/16\n", LocalNodeCIDR, nil},
		{"interface prefix needs no clusterCIDR", "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: cali}\nserviceCIDR: 172.30.0.0/16\n", LocalInterfacePrefix, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := DecodeOptions([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			c, warnings := mustConfig(t, o)
			if c.LocalMode != tc.mode || c.Table != DefaultTable || c.MasqueradeBit != DefaultMasqueradeBit {
				t.Errorf("mode %q table %q bit %d; want %q, %q, %d", c.LocalMode, c.Table, c.MasqueradeBit, tc.mode, DefaultTable, DefaultMasqueradeBit)
			}
			if len(tc.warnings) == 0 {
				if len(warnings) != 0 {
					t.Errorf("warnings %q, want none", warnings)
				}
				return
			}
			if len(warnings) != 1 {
				t.Fatalf("warnings %q, want one", warnings)
			}
			for _, w := range tc.warnings {
				if !strings.Contains(warnings[0], w) {
					t.Errorf("warning %q lacks %q", warnings[0], w)
				}
			}
			if strings.Contains(tc.doc, "serviceCIDR") && strings.Contains(warnings[0], "serviceCIDR") {
				t.Errorf("warning %q names serviceCIDR although it is set", warnings[0])
			}
		})
	}
}

func TestOptionsStrictDecoding(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"clusterCIDRs: 10.0.0.0/8\n", `unknown field "clusterCIDRs"`},
		{"ClusterCIDR: 10.0.0.0/8\n", `unknown field "ClusterCIDR"`},
		{"detectlocalmode: ClusterCIDR\n", `unknown field "detectlocalmode"`},
		{"detectLocal: {InterfaceNamePrefix: cali}\n", `unknown field "detectLocal.InterfaceNamePrefix"`},
		{"detectLocal: {bridgeinterface: cbr0}\n", `unknown field "detectLocal.bridgeinterface"`},
		{`{"masqueradeall": true}`, `unknown field "masqueradeall"`},
		{"podInterfaceNamePrefix: cali\n", `unknown field "podInterfaceNamePrefix"`},
		{"tableName: a\ntableName: b\n", `"tableName"`},
		{"masqueradeAll: maybe\n", "masqueradeAll"},
		{"masqueradeBit: fourteen\n", "masqueradeBit"},
		{"nodePortAddresses: 10.0.0.0/8\n", "nodePortAddresses"},
		{"clusterCIDR: [10.0.0.0/8\n", "yaml"},
	} {
		_, err := DecodeOptions([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeOptions(%q): error %v, want one containing %s", tc.doc, err, tc.want)
		}
	}
}

func TestOptionsErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want []string
	}{
		{"clusterCIDR: 10.0.0.0/33\n", []string{`clusterCIDR (--cluster-cidr): invalid CIDR "10.0.0.0/33"`}},
		{"serviceCIDR: 172.30.0.0/16,nonsense\n", []string{`serviceCIDR (--service-cidr): invalid CIDR "nonsense"`}},
		{"nodePortAddresses: [primry]\n", []string{`nodePortAddresses (--nodeport-addresses): invalid CIDR "primry": want CIDRs and the keywords primary, all`}},
		{"nodePortAddresses: [primary, 10.0.0.0/8, primary]\n", []string{`nodePortAddresses (--nodeport-addresses): keyword "primary" given twice`}},
		{"nodePortAddresses: [localhost]\n", []string{`nodePortAddresses (--nodeport-addresses): keyword "localhost": not supported`}},
		{"detectLocalMode: Foo\n", []string{`detectLocalMode (--detect-local-mode): "Foo": want ClusterCIDR, NodeCIDR, InterfaceNamePrefix or BridgeInterface`}},
		{"detectLocalMode: clustercidr\n", []string{`detectLocalMode (--detect-local-mode): "clustercidr": want`}},
		{"detectLocalMode: nodecidr\n", []string{`detectLocalMode (--detect-local-mode): "nodecidr": want`}},
		{"detectLocalMode: BridgeInterface\n", []string{"detectLocal.bridgeInterface (--pod-bridge-interface): required when detectLocalMode is BridgeInterface"}},
		{"detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: 'cbr*'}\n", []string{`detectLocal.bridgeInterface (--pod-bridge-interface): "cbr*": '*' cannot be in an interface name here`}},
		{"detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: a-bridge-of-16-ch}\n", []string{`detectLocal.bridgeInterface (--pod-bridge-interface): "a-bridge-of-16-ch": longer than 15 bytes`}},
		{"detectLocalMode: bridgeinterface\ndetectLocal: {bridgeInterface: cbr0}\n", []string{`detectLocalMode (--detect-local-mode): "bridgeinterface": want ClusterCIDR, NodeCIDR, InterfaceNamePrefix or BridgeInterface`}},
		{"detectLocalMode: InterfaceNamePrefix\n", []string{"detectLocal.interfaceNamePrefix (--pod-interface-name-prefix): required when detectLocalMode is InterfaceNamePrefix"}},
		{"masqueradeBit: 0\n", []string{"masqueradeBit (--iptables-masquerade-bit): 0: want 1..31"}},
		{"masqueradeBit: 32\n", []string{"masqueradeBit (--iptables-masquerade-bit): 32"}},
		{"tableName: 'a b'\n", []string{`tableName (--table-name): "a b" is not a usable table name`}},
		{"clusterCIDR: x\ndetectLocalMode: Foo\nserviceCIDR: nope\n", []string{"clusterCIDR (", "detectLocalMode (", "serviceCIDR ("}},
	} {
		o, err := DecodeOptions([]byte(tc.doc))
		if err != nil {
			t.Fatalf("DecodeOptions(%q): %v", tc.doc, err)
		}
		_, _, err = o.Config()
		if err == nil {
			t.Errorf("%q: accepted", tc.doc)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q, want it to contain %q", tc.doc, err, w)
			}
		}
		if strings.Contains(err.Error(), "required when detectLocalMode is ClusterCIDR") {
			t.Errorf("%q: error %q reports an invalid clusterCIDR as missing too", tc.doc, err)
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fieldFlags[fe.Field] == "" {
			t.Errorf("%q: error %q is not a *FieldError of a known field", tc.doc, err)
		}
	}
}

// TestConfigValidateNamesOptionsFields: a Config built in code is checked in the
// same vocabulary as the file.
func TestConfigValidateNamesOptionsFields(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{LocalMode: LocalClusterCIDR}, "clusterCIDR (--cluster-cidr): required"},
		{Config{LocalMode: LocalInterfacePrefix}, "detectLocal.interfaceNamePrefix (--pod-interface-name-prefix): required"},
		{Config{LocalMode: LocalBridgeInterface}, "detectLocal.bridgeInterface (--pod-bridge-interface): required"},
		{Config{LocalMode: LocalBridgeInterface, BridgeInterface: "br 0"}, `detectLocal.bridgeInterface (--pod-bridge-interface): "br 0": ' ' cannot be`},
		{Config{MasqueradeBit: 40}, "masqueradeBit (--iptables-masquerade-bit): 40"},
		{Config{ServiceCIDRs: []netip.Prefix{{}}}, "serviceCIDR (--service-cidr): invalid prefix"},
	} {
		tc.c.Defaults()
		err := tc.c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", tc.c, err, tc.want)
		}
	}
}
