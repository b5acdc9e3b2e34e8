package takeover

import (
	"encoding/json"
	"fmt"
	"strings"
)

// iptables-nft keeps each iptables table in an nftables table of the same name, in the
// ip (IPv4) or ip6 (IPv6) family. nft lists and deletes their rules by handle whatever
// they hold: the xt expressions of matches nft cannot translate included.

// nftListing is the part of `nft --json list table` this package reads.
type nftListing struct {
	Nftables []struct {
		Chain *struct {
			Name string `json:"name"`
		} `json:"chain"`
		Rule *struct {
			Chain  string            `json:"chain"`
			Handle int               `json:"handle"`
			Expr   []json.RawMessage `json:"expr"`
		} `json:"rule"`
	} `json:"nftables"`
}

// ParseNftJSON reads `nft --json list table FAMILY name` into a Table. A rule's target
// is the chain of its jump or goto verdict.
func ParseNftJSON(name string, out []byte) (*Table, error) {
	var l nftListing
	if err := json.Unmarshal(out, &l); err != nil {
		return nil, fmt.Errorf("nft --json list table %s: %w", name, err)
	}
	t := &Table{Name: name}
	for _, o := range l.Nftables {
		if o.Chain != nil {
			t.Chains = append(t.Chains, o.Chain.Name)
		}
		if o.Rule != nil {
			t.Rules = append(t.Rules, Rule{Chain: o.Rule.Chain, Handle: o.Rule.Handle, Target: nftTarget(o.Rule.Expr)})
		}
	}
	return t, nil
}

// nftTarget returns the chain a rule's expressions jump or go to, or "".
func nftTarget(exprs []json.RawMessage) string {
	for _, e := range exprs {
		var v struct {
			Jump *struct{ Target string } `json:"jump"`
			Goto *struct{ Target string } `json:"goto"`
		}
		if json.Unmarshal(e, &v) != nil {
			continue // an expression of another shape (a match, a counter)
		}
		if v.Jump != nil {
			return v.Jump.Target
		}
		if v.Goto != nil {
			return v.Goto.Target
		}
	}
	return ""
}

// nftScript is the input of `nft -f -` that makes o in the table family table in one
// transaction: rules deleted by handle, chains flushed (their rules jump to one
// another), chains deleted. Names go unquoted, as nft's parser wants them:
// Owned admits only names of letters, digits, '-', '_' and '.'.
func nftScript(family, table string, o ops) string {
	var b strings.Builder
	for _, r := range o.rules {
		fmt.Fprintf(&b, "delete rule %s %s %s handle %d\n", family, table, r.Chain, r.Handle)
	}
	for _, c := range o.flush {
		fmt.Fprintf(&b, "flush chain %s %s %s\n", family, table, c)
	}
	for _, c := range o.chain {
		fmt.Fprintf(&b, "delete chain %s %s %s\n", family, table, c)
	}
	return b.String()
}
