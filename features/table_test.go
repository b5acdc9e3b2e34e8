package features

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// freshView is a small table as a fresh full build writes it: a dispatch chain
// with two class rules, an ordered chain, a class set and a dynamic set.
func freshView() *TableView {
	return &TableView{
		Chains: map[string][]string{
			ruleset.ChainServiceIPs: {"@service-ips-to-dnat-1 goto dnat-1", "@service-ips-to-dnat-2 goto dnat-2"},
			"filter":                {"ct state new jump a", "ct state new jump b"},
		},
		Sets: map[string][]string{"service-ips-to-dnat-1": {"172.30.0.1"}, "affinity-clients-0": {}},
		Maps: map[string][]string{"backends-1": {"172.30.0.1 : 10.1.0.1"}},
	}
}

func clone(v *TableView) *TableView {
	c := NewTableView()
	for name, r := range v.Chains {
		c.Chains[name] = append([]string{}, r...)
	}
	for name, e := range v.Sets {
		c.Sets[name] = append([]string{}, e...)
	}
	for name, e := range v.Maps {
		c.Maps[name] = append([]string{}, e...)
	}
	return c
}

func TestCompareFresh(t *testing.T) {
	want := ruleset.New(knftables.IPv4Family, "nftproxy")
	want.AddSet(&knftables.Set{Name: "affinity-clients-0", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag}})
	for _, c := range []struct {
		name    string
		change  func(v *TableView)
		problem string // "" when the tables must compare equal
	}{
		{"the same table", func(*TableView) {}, ""},
		{"a kept empty class set, its dispatch rule, chain and map", func(v *TableView) {
			v.Sets["service-ips-to-dnat-3"] = []string{}
			v.Maps["backends-3"] = []string{}
			v.Chains["dnat-3"] = []string{"numgen random mod 3 vmap @backends-3"}
			v.Chains[ruleset.ChainServiceIPs] = append(v.Chains[ruleset.ChainServiceIPs], "@service-ips-to-dnat-3 goto dnat-3")
		}, ""},
		{"dispatch rules in another order", func(v *TableView) {
			r := v.Chains[ruleset.ChainServiceIPs]
			r[0], r[1] = r[1], r[0]
		}, ""},
		{"records in a dynamic set", func(v *TableView) { v.Sets["affinity-clients-0"] = []string{"10.1.0.5"} }, ""},
		{"rules of an ordinary chain in another order", func(v *TableView) {
			r := v.Chains["filter"]
			r[0], r[1] = r[1], r[0]
		}, "chain filter has rules"},
		{"a stale element", func(v *TableView) {
			v.Sets["service-ips-to-dnat-1"] = append(v.Sets["service-ips-to-dnat-1"], "172.30.0.9")
		}, "set service-ips-to-dnat-1 has elements"},
		{"a missing map element", func(v *TableView) { v.Maps["backends-1"] = []string{} }, "map backends-1 has elements"},
		{"a kept set that is not empty", func(v *TableView) {
			v.Sets["service-ips-to-dnat-3"] = []string{"172.30.0.3"}
			v.Chains[ruleset.ChainServiceIPs] = append(v.Chains[ruleset.ChainServiceIPs], "@service-ips-to-dnat-3 goto dnat-3")
		}, "set service-ips-to-dnat-3, which a fresh build lacks, is not empty"},
		{"an extra dispatch rule on a set a fresh build has", func(v *TableView) {
			v.Chains[ruleset.ChainServiceIPs] = append(v.Chains[ruleset.ChainServiceIPs], "@service-ips-to-dnat-1 goto dnat-2")
		}, "chain service-ips has rules"},
		{"a missing chain", func(v *TableView) { delete(v.Chains, "filter") }, "chain filter is missing"},
		{"a missing set", func(v *TableView) { delete(v.Sets, "service-ips-to-dnat-1") }, "set service-ips-to-dnat-1 is missing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			live := clone(freshView())
			c.change(live)
			err := CompareFresh(live, freshView(), want)
			switch {
			case c.problem == "" && err != nil:
				t.Errorf("want equal, got %v", err)
			case c.problem != "" && (err == nil || !strings.Contains(err.Error(), c.problem)):
				t.Errorf("want a difference %q, got %v", c.problem, err)
			}
		})
	}
}

// TestRunComparesEverySync checks that a scenario's sync fails when the table the
// Proxier keeps differs from a fresh build: an element added behind the Proxier's
// back survives an incremental sync (which never lists the table) and is caught,
// and the periodic full resync removes it.
func TestRunComparesEverySync(t *testing.T) {
	sc, err := Parse([]byte(scenarioWith("clusterCIDR: 10.0.0.0/8\nserviceCIDR: 172.30.0.0/16")), "drift.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b := NewSimBackend()
	run, err := Start(sc, b)
	if err != nil {
		t.Fatal(err)
	}
	fake := b.fakes[knftables.IPv4Family]
	sets, err := fake.List(context.Background(), "sets")
	if err != nil {
		t.Fatal(err)
	}
	var class string
	for _, s := range sets {
		if strings.Contains(s, "-to-") {
			class = s
			break
		}
	}
	if class == "" {
		t.Fatalf("no class set among %v", sets)
	}
	tx := fake.NewTransaction()
	tx.Add(&knftables.Element{Set: class, Key: []string{"172.30.0.99", "tcp", "80"}})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	slice := Docs{Line: 1, Text: `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.1.0.20]
`}
	err = run.Update(slice)
	if err == nil || !strings.Contains(err.Error(), "172.30.0.99") {
		t.Fatalf("an incremental sync over a drifted table: want the stray element named, got %v", err)
	}
	if err := run.Resync(); err != nil {
		t.Fatalf("the full resync should repair the drift: %v", err)
	}
}
