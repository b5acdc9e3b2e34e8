// Package takeover removes what kube-proxy in iptables mode leaves on a node once
// nftproxy has taken it over: the jumps from the built-in chains into kube-proxy's
// chains, then those chains, in the nat, filter and mangle tables of both families and
// of both iptables backends (iptables-nft, through nft; iptables-legacy, through the
// node's iptables-legacy-save and -restore) — what `kube-proxy --cleanup` removes.
// Chains kube-proxy does not own (the kubelet's KUBE-FIREWALL and KUBE-KUBELET-CANARY,
// Docker's, a CNI's) and rules not jumping into kube-proxy's chains stay.
package takeover

import "strings"

// Tables are the iptables tables kube-proxy's iptables mode writes to.
var Tables = []string{"nat", "filter", "mangle"}

// ownedChains are the chains of fixed name kube-proxy v1.37's iptables mode creates,
// by table (pkg/proxy/iptables: the chains its CleanupLeftovers flushes and deletes).
var ownedChains = map[string][]string{
	"nat":    {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY"},
	"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY"},
	"mangle": {"KUBE-PROXY-CANARY"},
}

// servicePrefixes name kube-proxy's per-Service and per-endpoint chains of the nat table
// (cluster and local policy, endpoint, firewall, external).
var servicePrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-"}

// builtinChains are iptables' built-in chains: the only chains kube-proxy jumps from
// into its own.
var builtinChains = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

// Owned reports whether chain of table is one kube-proxy's iptables mode creates. Names
// of other characters than kube-proxy's (letters, digits, '-', '_', '.') are not.
func Owned(table, chain string) bool {
	if strings.ContainsFunc(chain, func(r rune) bool {
		return !('A' <= r && r <= 'Z' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || strings.ContainsRune("-_.", r))
	}) {
		return false
	}
	for _, c := range ownedChains[table] {
		if c == chain {
			return true
		}
	}
	if table != "nat" {
		return false
	}
	for _, p := range servicePrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// Table is what a backend lists of one table of one family.
type Table struct {
	// Name is nat, filter or mangle.
	Name string
	// Chains are the table's chains, built-in ones included.
	Chains []string
	// Rules are the rules of every chain, in order.
	Rules []Rule
}

// Rule is one rule of a Table.
type Rule struct {
	// Chain holds the rule; Target is the chain it jumps or goes to, or its verdict.
	Chain, Target string
	// Spec is the rule as iptables-save writes it, after "-A CHAIN " (iptables-legacy).
	Spec string
	// Handle is the rule's nftables handle (iptables-nft).
	Handle int
}

// Removal is what Select picks in a table: rules first, then chains.
type Removal struct {
	// Rules are the jumps from built-in chains into kube-proxy's chains.
	Rules []Rule
	// Chains are kube-proxy's chains, flushed and then deleted.
	Chains []string
}

// Empty reports whether there is nothing to remove.
func (r Removal) Empty() bool { return len(r.Rules) == 0 && len(r.Chains) == 0 }

// Select picks what to remove of t: every rule of a built-in chain whose target is a
// chain kube-proxy owns, and those chains. Rules inside kube-proxy's chains go with
// their chains; anything else stays.
func Select(t *Table) Removal {
	var r Removal
	for _, rule := range t.Rules {
		if builtinChains[rule.Chain] && Owned(t.Name, rule.Target) {
			r.Rules = append(r.Rules, rule)
		}
	}
	for _, c := range t.Chains {
		if Owned(t.Name, c) {
			r.Chains = append(r.Chains, c)
		}
	}
	return r
}
