// Package syncer applies desired rulesets to an nftables table through
// knftables.Interface: a full sync first and whenever asked, otherwise an
// incremental transaction that holds only what changed since the last sync.
package syncer

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// Syncer keeps one nftables table equal to the desired Ruleset. It remembers what it
// applied last, so incremental syncs never list the kernel's table; any failed
// transaction makes the next sync a full one. A Syncer is not safe for concurrent use.
type Syncer struct {
	nft     knftables.Interface
	applied *ruleset.Ruleset
	full    bool
}

// Result describes one sync.
type Result struct {
	// Full is true when the sync rewrote the whole table.
	Full bool
	// Operations is the number of nft operations in the transaction (0 when
	// nothing changed and no transaction was run).
	Operations int
}

// New returns a Syncer that applies rulesets through nft. Its first sync is full.
func New(nft knftables.Interface) *Syncer {
	return &Syncer{nft: nft, full: true}
}

// RequestFullSync makes the next Sync a full one, which repairs any drift between
// the kernel and what the Syncer believes it applied (a periodic resync calls this).
func (s *Syncer) RequestFullSync() { s.full = true }

// Applied returns the ruleset applied by the last successful sync, or nil.
func (s *Syncer) Applied() *ruleset.Ruleset { return s.applied }

// Sync makes the table equal to desired. The Syncer keeps desired as the applied
// state, so callers must not modify it afterwards.
func (s *Syncer) Sync(ctx context.Context, desired *ruleset.Ruleset) (Result, error) {
	if s.full || s.applied == nil || needsFull(s.applied, desired) {
		return s.fullSync(ctx, desired)
	}
	tx := s.nft.NewTransaction()
	diff(tx, s.applied, desired)
	res := Result{Operations: tx.NumOperations()}
	if res.Operations == 0 {
		s.applied = desired
		return res, nil
	}
	if err := s.nft.Run(ctx, tx); err != nil {
		s.full = true
		return res, fmt.Errorf("incremental sync of table %s %s (%d operations): %w", desired.Family, desired.Table, res.Operations, err)
	}
	s.applied = desired
	return res, nil
}

// fullSync rewrites the table: existing chains, sets and maps are flushed, the desired
// ruleset is added, and objects that are no longer wanted are deleted — all in one
// atomic transaction. Should the kernel refuse it (an object of ours changed its
// definition), the table is deleted and created anew in one transaction instead.
func (s *Syncer) fullSync(ctx context.Context, desired *ruleset.Ruleset) (Result, error) {
	existing, err := s.nft.ListAll(ctx)
	if err != nil && !knftables.IsNotFound(err) {
		s.full = true
		return Result{Full: true}, fmt.Errorf("full sync of table %s %s: listing existing objects: %w", desired.Family, desired.Table, err)
	}
	tx := s.nft.NewTransaction()
	tx.Add(desired.TableObject())
	for _, name := range existing["chain"] {
		tx.Flush(&knftables.Chain{Name: name})
	}
	for _, name := range existing["set"] {
		tx.Flush(&knftables.Set{Name: name})
	}
	for _, name := range existing["map"] {
		tx.Flush(&knftables.Map{Name: name})
	}
	if s.applied != nil {
		// Sets and maps whose definition changed cannot be re-added over the old one.
		for name, set := range s.applied.Sets {
			if want, ok := desired.Sets[name]; ok && !sameSet(set, want) && slices.Contains(existing["set"], name) {
				tx.Delete(&knftables.Set{Name: name})
			}
		}
		for name, m := range s.applied.Maps {
			if want, ok := desired.Maps[name]; ok && !sameMap(m, want) && slices.Contains(existing["map"], name) {
				tx.Delete(&knftables.Map{Name: name})
			}
		}
	}
	desired.AddTo(tx)
	for _, name := range existing["chain"] {
		if _, ok := desired.Chains[name]; !ok {
			tx.Delete(&knftables.Chain{Name: name})
		}
	}
	for _, name := range existing["set"] {
		if _, ok := desired.Sets[name]; !ok {
			tx.Delete(&knftables.Set{Name: name})
		}
	}
	for _, name := range existing["map"] {
		if _, ok := desired.Maps[name]; !ok {
			tx.Delete(&knftables.Map{Name: name})
		}
	}
	res := Result{Full: true, Operations: tx.NumOperations()}
	if err := s.nft.Run(ctx, tx); err != nil {
		// Recreate the table from scratch, atomically.
		tx = s.nft.NewTransaction()
		tx.Add(desired.TableObject())
		tx.Delete(desired.TableObject())
		desired.AddTo(tx)
		res.Operations = tx.NumOperations()
		if err2 := s.nft.Run(ctx, tx); err2 != nil {
			s.full = true
			s.applied = nil
			return res, fmt.Errorf("full sync of table %s %s: %w (recreating the table: %v)", desired.Family, desired.Table, err, err2)
		}
	}
	s.applied = desired
	s.full = false
	return res, nil
}

// needsFull reports whether going from old to desired needs a full sync: the table
// changed identity, or a set or map kept its name but changed its definition.
func needsFull(old, desired *ruleset.Ruleset) bool {
	if old.Family != desired.Family || old.Table != desired.Table || old.Comment != desired.Comment {
		return true
	}
	for name, set := range old.Sets {
		if want, ok := desired.Sets[name]; ok && !sameSet(set, want) {
			return true
		}
	}
	for name, m := range old.Maps {
		if want, ok := desired.Maps[name]; ok && !sameMap(m, want) {
			return true
		}
	}
	for name, c := range old.Chains {
		if want, ok := desired.Chains[name]; ok && !sameChainDef(&c.Chain, &want.Chain) {
			return true
		}
	}
	return false
}

// diff queues on tx the operations that turn old into desired, ordered so that every
// object exists before something refers to it and nothing is deleted while
// referenced.
func diff(tx *knftables.Transaction, old, desired *ruleset.Ruleset) {
	// 1. New containers.
	for _, name := range ruleset.SortedKeys(desired.Chains) {
		if _, ok := old.Chains[name]; !ok {
			tx.Add(desired.ChainObject(name))
		}
	}
	for _, name := range ruleset.SortedKeys(desired.Sets) {
		if _, ok := old.Sets[name]; !ok {
			tx.Add(desired.SetObject(name))
		}
	}
	for _, name := range ruleset.SortedKeys(desired.Maps) {
		if _, ok := old.Maps[name]; !ok {
			tx.Add(desired.MapObject(name))
		}
	}
	// 2. Rules of new and changed chains.
	for _, name := range ruleset.SortedKeys(desired.Chains) {
		oc, existed := old.Chains[name]
		if existed && sameRules(oc.Rules, desired.Chains[name].Rules) {
			continue
		}
		if existed {
			tx.Flush(desired.ChainObject(name))
		}
		desired.AddRulesTo(tx, name)
	}
	// 3. Elements: deletions (removed or changed), then additions, in containers that
	// exist on both sides or are new.
	var adds []*knftables.Element
	for _, c := range sortedUnion(old.Elements, desired.Elements) {
		if !hasContainer(desired, c) {
			continue // the container itself goes away below
		}
		oldEls, newEls := old.Elements[c], desired.Elements[c]
		for _, k := range ruleset.SortedKeys(oldEls) {
			ne, ok := newEls[k]
			if !ok || !sameElement(oldEls[k], ne) {
				tx.Delete(desired.ElementObject(oldEls[k]))
			}
		}
		for _, k := range ruleset.SortedKeys(newEls) {
			oe, ok := oldEls[k]
			if !ok || !sameElement(oe, newEls[k]) {
				adds = append(adds, newEls[k])
			}
		}
	}
	for _, e := range adds {
		tx.Add(desired.ElementObject(e))
	}
	// 4. Removed chains (flushed first, as they may jump to each other), then
	// removed sets and maps, which only removed or flushed rules referred to.
	var gone []string
	for _, name := range ruleset.SortedKeys(old.Chains) {
		if _, ok := desired.Chains[name]; !ok {
			gone = append(gone, name)
			tx.Flush(old.ChainObject(name))
		}
	}
	for _, name := range gone {
		tx.Delete(old.ChainObject(name))
	}
	for _, name := range ruleset.SortedKeys(old.Sets) {
		if _, ok := desired.Sets[name]; !ok {
			tx.Delete(old.SetObject(name))
		}
	}
	for _, name := range ruleset.SortedKeys(old.Maps) {
		if _, ok := desired.Maps[name]; !ok {
			tx.Delete(old.MapObject(name))
		}
	}
}

func hasContainer(r *ruleset.Ruleset, name string) bool {
	_, set := r.Sets[name]
	_, m := r.Maps[name]
	return set || m
}

func sortedUnion[V any](a, b map[string]V) []string {
	u := maps.Clone(a)
	if u == nil {
		u = map[string]V{}
	}
	maps.Copy(u, b)
	return ruleset.SortedKeys(u)
}
