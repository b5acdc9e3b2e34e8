package features

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// TableView is an nftables table as read back from a backend: each chain's rules
// in order, each set's and map's elements sorted. Rules and elements are opaque
// strings in the backend's own rendering, so only views read the same way compare.
type TableView struct {
	Chains map[string][]string
	Sets   map[string][]string
	Maps   map[string][]string
}

// NewTableView returns an empty view.
func NewTableView() *TableView {
	return &TableView{Chains: map[string][]string{}, Sets: map[string][]string{}, Maps: map[string][]string{}}
}

// ReadTable reads the table of nft into a view. It needs the rules' text from
// ListRules, which a knftables.Fake gives and nft's own listing does not.
func ReadTable(ctx context.Context, nft knftables.Interface) (*TableView, error) {
	v := NewTableView()
	chains, err := nft.List(ctx, "chains")
	if err != nil {
		return nil, fmt.Errorf("listing chains: %w", err)
	}
	for _, c := range chains {
		rules, err := nft.ListRules(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("listing the rules of chain %s: %w", c, err)
		}
		v.Chains[c] = []string{}
		for _, r := range rules {
			text := r.Rule
			if r.Comment != nil {
				text += fmt.Sprintf(" comment %q", *r.Comment)
			}
			v.Chains[c] = append(v.Chains[c], text)
		}
	}
	for kind, into := range map[string]map[string][]string{"set": v.Sets, "map": v.Maps} {
		names, err := nft.List(ctx, kind+"s")
		if err != nil {
			return nil, fmt.Errorf("listing %ss: %w", kind, err)
		}
		for _, name := range names {
			els, err := nft.ListElements(ctx, kind, name)
			if err != nil {
				return nil, fmt.Errorf("listing the elements of %s %s: %w", kind, name, err)
			}
			into[name] = []string{}
			for _, e := range els {
				into[name] = append(into[name], elementText(e))
			}
			slices.Sort(into[name])
		}
	}
	return v, nil
}

// elementText renders an element as nft writes it.
func elementText(e *knftables.Element) string {
	s := strings.Join(e.Key, " . ")
	if len(e.Value) > 0 {
		s += " : " + strings.Join(e.Value, " . ")
	}
	if e.Comment != nil {
		s += fmt.Sprintf(" comment %q", *e.Comment)
	}
	return s
}

// setRef finds the named sets and maps a rule refers to (@name), in either
// rendering: nft text or nft's JSON.
var setRef = regexp.MustCompile(`@([A-Za-z0-9_.-]+)`)

// CompareFresh reports how live, a table brought to some state by a Proxier's
// syncs, differs from fresh, the table one full sync of want (the ruleset.Build of
// the same state) writes on its own; nil when they serve alike. Incremental syncs
// may leave emptied objects behind for the next scale-up (syncer.WithKeepLimit):
// live may hold chains, sets and maps fresh lacks as long as those sets and maps
// are empty, and its dispatch chains (ruleset.IsDispatchChain) may hold rules that
// match only such an empty set and may order their rules otherwise, as those rules
// are disjoint. Elements of dynamic sets and maps are the packets' and not
// compared.
func CompareFresh(live, fresh *TableView, want *ruleset.Ruleset) error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	kept := map[string]bool{}
	for kind, pair := range map[string][2]map[string][]string{"set": {live.Sets, fresh.Sets}, "map": {live.Maps, fresh.Maps}} {
		l, f := pair[0], pair[1]
		for _, name := range ruleset.SortedKeys(f) {
			got, ok := l[name]
			switch {
			case !ok:
				add("%s %s is missing", kind, name)
			case !dynamic(want, kind, name) && !slices.Equal(got, f[name]):
				add("%s %s has elements %q, a fresh build %q", kind, name, got, f[name])
			}
		}
		for _, name := range ruleset.SortedKeys(l) {
			if _, ok := f[name]; ok {
				continue
			}
			if len(l[name]) > 0 {
				add("%s %s, which a fresh build lacks, is not empty: %q", kind, name, l[name])
			}
			kept[name] = true
		}
	}
	for _, name := range ruleset.SortedKeys(fresh.Chains) {
		got, ok := live.Chains[name]
		if !ok {
			add("chain %s is missing", name)
			continue
		}
		wantRules := fresh.Chains[name]
		if ruleset.IsDispatchChain(name) {
			got = slices.DeleteFunc(slices.Clone(got), func(r string) bool { return matchesKeptOnly(r, kept) })
			got, wantRules = sorted(got), sorted(wantRules)
		}
		if !slices.Equal(got, wantRules) {
			add("chain %s has rules\n\t\t%s\n\ta fresh build\n\t\t%s", name,
				strings.Join(got, "\n\t\t"), strings.Join(wantRules, "\n\t\t"))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("table %s %s differs from a fresh full build of the same state:\n\t%s",
		want.Family, want.Table, strings.Join(problems, "\n\t"))
}

// matchesKeptOnly reports whether rule refers to a kept (empty) set.
func matchesKeptOnly(rule string, kept map[string]bool) bool {
	for _, m := range setRef.FindAllStringSubmatch(rule, -1) {
		if kept[m[1]] {
			return true
		}
	}
	return false
}

// dynamic reports whether want's set or map name is filled by packets.
func dynamic(want *ruleset.Ruleset, kind, name string) bool {
	if kind == "set" {
		s := want.Sets[name]
		return s != nil && slices.Contains(s.Flags, knftables.DynamicFlag)
	}
	m := want.Maps[name]
	return m != nil && slices.Contains(m.Flags, knftables.DynamicFlag)
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
