package syncer

import (
	"reflect"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// DefaultKeepLimit is the number of emptied chains, sets and maps incremental syncs
// leave in the table before one of them removes them all (see keeper).
const DefaultKeepLimit = 64

// WithKeepLimit makes incremental syncs leave up to n emptied chains, sets and maps
// in the table (see keeper); 0 removes them in the sync that empties them, so that
// the table always equals the desired ruleset. The default is DefaultKeepLimit.
func WithKeepLimit(n int) Option {
	return func(s *Syncer) { s.keepLimit = max(n, 0) }
}

// keeper lets incremental syncs leave emptied objects in the table. When a Service's
// endpoint count goes from 5 to 6 and back, the ruleset gains and loses a dnat-6
// chain, its backends map and chain, the class set service-ips-to-dnat-6 and that
// set's rule in the dispatch chain service-ips. Deleting them only to add them again
// at the next scale-up costs a dozen operations each way, and rewriting the dispatch
// chain (flush and every rule again) is most of them. So an incremental sync that
// removes a chain, set or map empties it instead (its elements are deleted one by
// one, as the delta lists them; a dynamic set is flushed) and keeps it, and a rule
// of a dispatch chain whose class set went away stays; a later sync that wants the
// object again finds it there, and a dispatch chain that gains a rule has it
// appended. An empty class set matches nothing, and the rules of a dispatch chain
// are disjoint, so the kept objects change no verdict.
//
// Once more than the limit are kept, the next incremental sync also removes them
// and rewrites the dispatch chains that still have extra rules; a full sync removes
// them too, as it removes anything the ruleset does not have.
type keeper struct {
	chains map[string]*ruleset.Chain
	sets   map[string]*knftables.Set
	maps   map[string]*knftables.Map
	// rules holds the rules in the kernel of each dispatch chain whose rules differ
	// from the applied ruleset's.
	rules map[string][]*knftables.Rule
}

func newKeeper() *keeper {
	return &keeper{
		chains: map[string]*ruleset.Chain{},
		sets:   map[string]*knftables.Set{},
		maps:   map[string]*knftables.Map{},
		rules:  map[string][]*knftables.Rule{},
	}
}

// count returns the number of kept objects.
func (k *keeper) count() int {
	if k == nil {
		return 0
	}
	return len(k.chains) + len(k.sets) + len(k.maps)
}

// conflicts reports whether delta adds a set or map the keeper holds with another
// definition, which cannot be changed in place: the sync must then be a full one.
func (k *keeper) conflicts(delta *changeset.Delta) bool {
	if k == nil {
		return false
	}
	for name, c := range delta.Sets {
		if old := k.sets[name]; old != nil && c.Old == nil && c.New != nil && !reflect.DeepEqual(old, c.New) {
			return true
		}
	}
	for name, c := range delta.Maps {
		if old := k.maps[name]; old != nil && c.Old == nil && c.New != nil && !reflect.DeepEqual(old, c.New) {
			return true
		}
	}
	return false
}

// kernelRules returns the rules of dispatch chain name in the kernel, given its
// version old in the applied ruleset.
func (k *keeper) kernelRules(name string, old *ruleset.Chain) []*knftables.Rule {
	if r, ok := k.rules[name]; ok {
		return r
	}
	return old.Rules
}

// appendMissing queues the rules of want that dispatch chain name lacks in the
// kernel (have), and records what the chain then holds.
func (k *keeper) appendMissing(tx txWriter, desired *ruleset.Ruleset, name string, have []*knftables.Rule, want *ruleset.Chain) {
	now := slices.Clone(have)
	for _, r := range want.Rules {
		if !slices.ContainsFunc(have, func(h *knftables.Rule) bool { return ruleset.SameRule(h, r) }) {
			tx.Add(desired.RuleObject(name, r))
			now = append(now, r)
		}
	}
	if slices.EqualFunc(now, want.Rules, ruleset.SameRule) {
		delete(k.rules, name)
	} else {
		k.rules[name] = now
	}
}

// tidy queues the removal of every kept object and the rewrite of every dispatch
// chain with extra rules, to follow the rest of a transaction that brought the
// table to desired.
func (k *keeper) tidy(tx txWriter, desired *ruleset.Ruleset) {
	for _, name := range ruleset.SortedKeys(k.rules) {
		if desired.Chains[name] == nil {
			continue
		}
		tx.Flush(desired.ChainObject(name))
		desired.AddRulesTo(tx, name)
	}
	var chains []knftables.Chain
	for _, name := range ruleset.SortedKeys(k.chains) {
		chains = append(chains, k.chains[name].Chain)
	}
	removeObjects(tx, desired, chains, ruleset.SortedKeys(k.sets), ruleset.SortedKeys(k.maps))
	k.reset()
}

// keepRemoved keeps the chains, sets and maps delta removes, emptied: the delta
// deletes their elements one by one, except those of a dynamic set or map, which
// are the kernel's and go with a flush.
func (k *keeper) keepRemoved(tx txWriter, desired *ruleset.Ruleset, delta *changeset.Delta) {
	for name, c := range delta.Chains {
		if c.New == nil {
			k.chains[name] = c.Old
		}
	}
	for _, name := range ruleset.SortedKeys(delta.Sets) {
		if c := delta.Sets[name]; c.New == nil {
			k.sets[name] = c.Old
			if slices.Contains(c.Old.Flags, knftables.DynamicFlag) {
				tx.Flush(&knftables.Set{Family: desired.Family, Table: desired.Table, Name: name})
			}
		}
	}
	for _, name := range ruleset.SortedKeys(delta.Maps) {
		if c := delta.Maps[name]; c.New == nil {
			k.maps[name] = c.Old
			if slices.Contains(c.Old.Flags, knftables.DynamicFlag) {
				tx.Flush(&knftables.Map{Family: desired.Family, Table: desired.Table, Name: name})
			}
		}
	}
}

// reset forgets every kept object: a full sync removed them.
func (k *keeper) reset() {
	if k == nil {
		return
	}
	clear(k.chains)
	clear(k.sets)
	clear(k.maps)
	clear(k.rules)
}

// takeChain returns the kept chain name, no longer kept, or nil.
func (k *keeper) takeChain(name string) *ruleset.Chain {
	if k == nil {
		return nil
	}
	c := k.chains[name]
	delete(k.chains, name)
	return c
}

// takeSet reports whether set name was kept, and keeps it no longer. conflicts has
// ruled out a kept set of another definition.
func (k *keeper) takeSet(name string) bool {
	if k == nil {
		return false
	}
	_, ok := k.sets[name]
	delete(k.sets, name)
	return ok
}

// takeMap is takeSet for maps.
func (k *keeper) takeMap(name string) bool {
	if k == nil {
		return false
	}
	_, ok := k.maps[name]
	delete(k.maps, name)
	return ok
}
