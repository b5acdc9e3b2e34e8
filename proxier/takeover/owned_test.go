package takeover

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// loadDump parses a testdata dump by table name.
func loadDump(t *testing.T, file string) map[string]*Table {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := ParseSave(string(b))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Table{}
	for _, tb := range tables {
		byName[tb.Name] = tb
	}
	return byName
}

// TestSelectKubeProxyNode: on a node kube-proxy's iptables mode programmed (a real dump,
// with the kubelet's and Docker's chains added), every jump from a built-in chain into
// kube-proxy's chains and all those chains are picked; the kubelet's KUBE-FIREWALL and
// KUBE-KUBELET-CANARY, Docker's chain and the jumps to them stay.
func TestSelectKubeProxyNode(t *testing.T) {
	for _, file := range []string{"testdata/kube-proxy-iptables.save", "testdata/kube-proxy-ip6tables.save"} {
		tables := loadDump(t, file)
		if len(tables) != 3 {
			t.Fatalf("%s: tables %v, want nat, filter, mangle", file, tables)
		}
		for _, name := range Tables {
			tb := tables[name]
			rm := Select(tb)
			var kept []string
			for _, c := range tb.Chains {
				if !builtinChains[c] && !slices.Contains(rm.Chains, c) {
					kept = append(kept, c)
				}
			}
			wantKept := map[string][]string{
				"nat":    {"KUBE-KUBELET-CANARY", "DOCKER"},
				"filter": {"KUBE-FIREWALL", "KUBE-KUBELET-CANARY"},
				"mangle": {"KUBE-KUBELET-CANARY"},
			}[name]
			if !slices.Equal(kept, wantKept) {
				t.Errorf("%s table %s: chains kept %v, want %v", file, name, kept, wantKept)
			}
			for _, c := range rm.Chains {
				if !strings.HasPrefix(c, "KUBE-") {
					t.Errorf("%s table %s: chain %s picked", file, name, c)
				}
			}
			checkRules(t, file, tb, rm)
		}
		if n := len(Select(tables["nat"]).Chains); strings.Contains(file, "ip6") == (n > 5) {
			t.Errorf("%s: %d nat chains picked; the IPv4 dump has kube-proxy's Service chains, the IPv6 one its 5 fixed chains", file, n)
		}
	}
}

// checkRules fails t unless rm's rules are exactly the rules of tb's built-in chains
// that jump into a picked chain, and no picked chain is the target of a kept rule
// outside the picked chains (which would keep it from being deleted).
func checkRules(t *testing.T, file string, tb *Table, rm Removal) {
	t.Helper()
	for _, r := range tb.Rules {
		picked := slices.ContainsFunc(rm.Rules, func(p Rule) bool { return p == r })
		inPicked := slices.Contains(rm.Chains, r.Chain)
		toPicked := slices.Contains(rm.Chains, r.Target)
		switch {
		case picked && (!builtinChains[r.Chain] || !toPicked):
			t.Errorf("%s table %s: rule -A %s %s picked", file, tb.Name, r.Chain, r.Spec)
		case !picked && !inPicked && toPicked:
			t.Errorf("%s table %s: rule -A %s %s, jumping into a picked chain, kept", file, tb.Name, r.Chain, r.Spec)
		}
	}
	if tb.Name != "mangle" && len(rm.Rules) == 0 {
		t.Errorf("%s table %s: no jump picked", file, tb.Name)
	}
}

// TestOwned: the chains kube-proxy's iptables mode names, by table.
func TestOwned(t *testing.T) {
	for _, c := range []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SERVICES", true},
		{"nat", "KUBE-SEP-C5LHEVBDT6I4XF6R", true},
		{"filter", "KUBE-SEP-C5LHEVBDT6I4XF6R", false}, // Service chains are nat's only
		{"filter", "KUBE-PROXY-FIREWALL", true},
		{"filter", "KUBE-FIREWALL", false},
		{"mangle", "KUBE-PROXY-CANARY", true},
		{"mangle", "KUBE-SERVICES", false},
		{"nat", "KUBE-KUBELET-CANARY", false},
		{"nat", "KUBE-MARK-DROP", false}, // the kubelet's, before v1.28
		{"nat", "KUBE-SVC-A;flush", false},
		{"raw", "KUBE-SERVICES", false},
	} {
		if got := Owned(c.table, c.chain); got != c.want {
			t.Errorf("Owned(%s, %s) = %v, want %v", c.table, c.chain, got, c.want)
		}
	}
}

// TestParseSaveErrors: a rule outside a table and an unknown line are errors naming
// the line.
func TestParseSaveErrors(t *testing.T) {
	for _, dump := range []string{"-A INPUT -j ACCEPT\n", "*nat\n:PREROUTING ACCEPT [0:0]\n-I PREROUTING -j X\nCOMMIT\n"} {
		if _, err := ParseSave(dump); err == nil || !strings.Contains(err.Error(), "line") {
			t.Errorf("ParseSave(%q): err %v, want one naming the line", dump, err)
		}
	}
}

// TestTargetQuoted: words of a quoted comment are not options.
func TestTargetQuoted(t *testing.T) {
	spec := `-m comment --comment "say \"-j X\" -g Y" -j KUBE-SERVICES`
	if got := target(spec); got != "KUBE-SERVICES" {
		t.Errorf("target(%q) = %q, want KUBE-SERVICES", spec, got)
	}
}
