// Package syncer applies desired rulesets to an nftables table through
// knftables.Interface: a full sync first and whenever asked, otherwise an
// incremental transaction that holds only what changed since the last sync.
package syncer

import (
	"context"
	"fmt"
	"reflect"
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
	// live is true when applied is a Builder's ruleset, which changes in place, so
	// that it cannot serve as the old side of a diff.
	live bool
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

// Sync makes the table equal to desired, diffing it against what was applied last
// (O(size of the ruleset) in CPU, O(changes) in nft operations). The Syncer keeps
// desired as the applied state, so callers must not modify it afterwards.
func (s *Syncer) Sync(ctx context.Context, desired *ruleset.Ruleset) (Result, error) {
	if s.full || s.applied == nil || s.live {
		return s.fullSync(ctx, desired)
	}
	return s.apply(ctx, desired, ruleset.Diff(s.applied, desired))
}

// Apply makes the table equal to desired, given delta, what changed in desired
// since the last Apply: the output of ruleset.Builder.Update. Its cost is O(delta),
// whatever the size of the ruleset. desired may keep changing between calls (it is
// the Builder's own ruleset); a Syncer fed by Apply must not also be fed by Sync.
// When a full sync is due (the first sync, after RequestFullSync or a failure),
// delta is ignored and the whole of desired is written.
func (s *Syncer) Apply(ctx context.Context, desired *ruleset.Ruleset, delta *ruleset.Delta) (Result, error) {
	if s.full || s.applied == nil || delta == nil {
		res, err := s.fullSync(ctx, desired)
		s.live = err == nil
		return res, err
	}
	s.live = true
	return s.apply(ctx, desired, delta)
}

// apply sends delta as one transaction, or a full sync when delta changes an
// object's definition in a way nft cannot update in place.
func (s *Syncer) apply(ctx context.Context, desired *ruleset.Ruleset, delta *ruleset.Delta) (Result, error) {
	if needsFull(s.applied, desired, delta) {
		return s.fullSync(ctx, desired)
	}
	tx := s.nft.NewTransaction()
	applyDelta(tx, desired, delta)
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
	if s.applied != nil && !s.live {
		// Sets and maps whose definition changed cannot be re-added over the old one.
		for name, set := range s.applied.Sets {
			if want, ok := desired.Sets[name]; ok && !reflect.DeepEqual(set, want) && slices.Contains(existing["set"], name) {
				tx.Delete(&knftables.Set{Name: name})
			}
		}
		for name, m := range s.applied.Maps {
			if want, ok := desired.Maps[name]; ok && !reflect.DeepEqual(m, want) && slices.Contains(existing["map"], name) {
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

// needsFull reports whether delta needs a full sync: the table changed identity, or
// a set, map or base chain kept its name but changed its definition, which nft
// cannot change in place.
func needsFull(old, desired *ruleset.Ruleset, delta *ruleset.Delta) bool {
	if old.Family != desired.Family || old.Table != desired.Table || old.Comment != desired.Comment {
		return true
	}
	for _, c := range delta.Sets {
		if c.Old != nil && c.New != nil {
			return true
		}
	}
	for _, c := range delta.Maps {
		if c.Old != nil && c.New != nil {
			return true
		}
	}
	for _, c := range delta.Chains {
		if c.Old != nil && c.New != nil && !reflect.DeepEqual(c.Old.Chain, c.New.Chain) {
			return true
		}
	}
	return false
}

// applyDelta queues on tx the operations that apply delta to the table, ordered so
// that every object exists before something refers to it and nothing is deleted
// while referenced.
func applyDelta(tx *knftables.Transaction, desired *ruleset.Ruleset, delta *ruleset.Delta) {
	chains := ruleset.SortedKeys(delta.Chains)
	// 1. New containers.
	for _, name := range chains {
		if c := delta.Chains[name]; c.Old == nil {
			tx.Add(desired.ChainObject(name))
		}
	}
	for _, name := range ruleset.SortedKeys(delta.Sets) {
		if c := delta.Sets[name]; c.Old == nil {
			tx.Add(desired.SetObject(name))
		}
	}
	for _, name := range ruleset.SortedKeys(delta.Maps) {
		if c := delta.Maps[name]; c.Old == nil {
			tx.Add(desired.MapObject(name))
		}
	}
	// 2. Rules of new and changed chains.
	for _, name := range chains {
		c := delta.Chains[name]
		if c.New == nil {
			continue
		}
		if c.Old != nil {
			tx.Flush(desired.ChainObject(name))
		}
		desired.AddRulesTo(tx, name)
	}
	// 3. Elements of containers that stay: deletions (removed or changed), then
	// additions. A container that goes away takes its elements with it.
	var adds []*knftables.Element
	for _, cont := range ruleset.SortedKeys(delta.Elements) {
		if gone(delta, cont) {
			continue
		}
		es := delta.Elements[cont]
		for _, k := range ruleset.SortedKeys(es) {
			if old := es[k].Old; old != nil && !isNewContainer(delta, cont) {
				tx.Delete(desired.ElementObject(old))
			}
		}
		for _, k := range ruleset.SortedKeys(es) {
			if e := es[k].New; e != nil {
				adds = append(adds, e)
			}
		}
	}
	for _, e := range adds {
		tx.Add(desired.ElementObject(e))
	}
	// 4. Removed chains (flushed first, as they may jump to each other), then
	// removed sets and maps, which only removed or flushed rules referred to.
	var removed []*knftables.Chain
	for _, name := range chains {
		if c := delta.Chains[name]; c.New == nil {
			ch := c.Old.Chain
			ch.Family, ch.Table, ch.Handle = desired.Family, desired.Table, nil
			tx.Flush(&ch)
			removed = append(removed, &ch)
		}
	}
	for _, ch := range removed {
		tx.Delete(ch)
	}
	for _, name := range ruleset.SortedKeys(delta.Sets) {
		if c := delta.Sets[name]; c.New == nil {
			tx.Delete(&knftables.Set{Family: desired.Family, Table: desired.Table, Name: name})
		}
	}
	for _, name := range ruleset.SortedKeys(delta.Maps) {
		if c := delta.Maps[name]; c.New == nil {
			tx.Delete(&knftables.Map{Family: desired.Family, Table: desired.Table, Name: name})
		}
	}
}

// gone reports whether the set or map named cont is removed by delta.
func gone(delta *ruleset.Delta, cont string) bool {
	if c, ok := delta.Sets[cont]; ok && c.New == nil {
		return true
	}
	if c, ok := delta.Maps[cont]; ok && c.New == nil {
		return true
	}
	return false
}

// isNewContainer reports whether the set or map named cont is created by delta, so
// that none of its elements exists yet.
func isNewContainer(delta *ruleset.Delta, cont string) bool {
	if c, ok := delta.Sets[cont]; ok && c.Old == nil {
		return true
	}
	if c, ok := delta.Maps[cont]; ok && c.Old == nil {
		return true
	}
	return false
}
