package features

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// scenarioWith is a minimal scenario with config as its config section (none when
// empty).
func scenarioWith(config string) string {
	s := "feature: test\npins: the config section\nnode:\n  addresses: [192.168.0.10]\n"
	if config != "" {
		s += "config:\n  " + strings.ReplaceAll(strings.TrimSpace(config), "\n", "\n  ") + "\n"
	}
	return s + `cluster: |
  apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default}
  spec:
    clusterIP: 172.30.0.10
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
steps:
- packet: tcp 10.1.0.5:40000 -> 172.30.0.10:80
  expect: {verdict: reject}
`
}

// TestConfigIsOptions: a scenario's config section gives the Config that
// ruleset.Options gives for the same fields, the one the daemon and nftrace use.
func TestConfigIsOptions(t *testing.T) {
	const fragment = `clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
serviceCIDR: 10.96.0.0/12
detectLocalMode: InterfaceNamePrefix
detectLocal: {interfaceNamePrefix: cali}
nodePortAddresses: [192.168.0.0/24]
masqueradeAll: true
masqueradeBit: 9
tableName: kp`
	ro, err := ruleset.DecodeOptions([]byte(fragment))
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := ro.Config()
	if err != nil {
		t.Fatal(err)
	}
	sc, err := Parse([]byte(scenarioWith(fragment)), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sc.Config, want) || len(sc.Warnings) != 0 {
		t.Errorf("scenario config %+v (warnings %q), want %+v", sc.Config, sc.Warnings, want)
	}
}

// TestConfigAssumesNoCIDR: a scenario without CIDRs gets no detector and no
// service-CIDR drop, and a warning saying so.
func TestConfigAssumesNoCIDR(t *testing.T) {
	sc, err := Parse([]byte(scenarioWith("")), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := sc.Config
	if c.LocalMode != ruleset.LocalNone || len(c.ClusterCIDRs) != 0 || len(c.ServiceCIDRs) != 0 {
		t.Errorf("config without CIDRs: %+v; want no detector and no CIDRs", c)
	}
	if len(sc.Warnings) != 1 || !strings.Contains(sc.Warnings[0], "clusterCIDR") || !strings.Contains(sc.Warnings[0], "serviceCIDR") {
		t.Errorf("warnings %q, want one naming clusterCIDR and serviceCIDR", sc.Warnings)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for config, want := range map[string]string{
		"clusterCIDRs: [10.0.0.0/8]":           `test.yaml:6: config: unknown field "clusterCIDRs"`,
		"ClusterCIDR: 10.0.0.0/8":              `unknown field "ClusterCIDR"`,
		"podInterfaceNamePrefix: cali":         `unknown field "podInterfaceNamePrefix"`,
		"detectLocalMode: Foo":                 `test.yaml:6: config: detectLocalMode (--detect-local-mode): "Foo": want ClusterCIDR, NodeCIDR, InterfaceNamePrefix or BridgeInterface`,
		"clusterCIDR: 10.0.0.0/33":             `clusterCIDR (--cluster-cidr): invalid CIDR "10.0.0.0/33"`,
		"detectLocalMode: BridgeInterface":     "detectLocal.bridgeInterface (--pod-bridge-interface): required",
		"detectLocalMode: InterfaceNamePrefix": "detectLocal.interfaceNamePrefix (--pod-interface-name-prefix): required",
	} {
		_, err := Parse([]byte(scenarioWith(config)), "test.yaml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: error %v, want one containing %s", config, err, want)
		}
	}
}
