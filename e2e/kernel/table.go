package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/features"
)

// readTable reads a table of ns from `nft -j list table`: one nft run, where
// knftables would run one per chain and set and still not give the rules' text.
// Rules and elements are kept as their JSON, with counters' values dropped, so two
// tables read this way compare exactly.
func readTable(ns *lab.NS, fam knftables.Family, table string) (*features.TableView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := ns.Exec(ctx, "", "nft", "-j", "list", "table", string(fam), table)
	if err != nil {
		return nil, err
	}
	return parseTableJSON([]byte(out))
}

// listing is the part of nft's JSON listing a TableView needs.
type listing struct {
	Nftables []struct {
		Chain *struct {
			Name string `json:"name"`
		} `json:"chain"`
		Set  *listedSet `json:"set"`
		Map  *listedSet `json:"map"`
		Rule *struct {
			Chain   string            `json:"chain"`
			Expr    []json.RawMessage `json:"expr"`
			Comment string            `json:"comment"`
		} `json:"rule"`
	} `json:"nftables"`
}

type listedSet struct {
	Name string            `json:"name"`
	Elem []json.RawMessage `json:"elem"`
}

// parseTableJSON turns nft's JSON listing of one table into a TableView.
func parseTableJSON(data []byte) (*features.TableView, error) {
	var l listing
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("nft's JSON listing: %w", err)
	}
	v := features.NewTableView()
	for _, o := range l.Nftables {
		switch {
		case o.Chain != nil:
			v.Chains[o.Chain.Name] = []string{}
		case o.Set != nil:
			v.Sets[o.Set.Name] = elements(o.Set.Elem)
		case o.Map != nil:
			v.Maps[o.Map.Name] = elements(o.Map.Elem)
		case o.Rule != nil:
			var exprs []string
			for _, e := range o.Rule.Expr {
				exprs = append(exprs, canonical(e))
			}
			text := fmt.Sprint(exprs)
			if o.Rule.Comment != "" {
				text += fmt.Sprintf(" comment %q", o.Rule.Comment)
			}
			v.Chains[o.Rule.Chain] = append(v.Chains[o.Rule.Chain], text)
		}
	}
	return v, nil
}

// elements returns a set's elements as canonical JSON, sorted.
func elements(raw []json.RawMessage) []string {
	out := []string{}
	for _, e := range raw {
		out = append(out, canonical(e))
	}
	slices.Sort(out)
	return out
}

// canonical re-encodes a JSON value with sorted keys and counters' values dropped.
func canonical(raw json.RawMessage) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	b, _ := json.Marshal(dropCounters(v))
	return string(b)
}

// dropCounters clears the packet and byte counts of counter statements, which
// differ between a table that saw traffic and a fresh one.
func dropCounters(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if k == "counter" {
				x[k] = nil
				continue
			}
			x[k] = dropCounters(val)
		}
	case []any:
		for i := range x {
			x[i] = dropCounters(x[i])
		}
	}
	return v
}
