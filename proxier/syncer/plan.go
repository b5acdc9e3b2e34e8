package syncer

import (
	"reflect"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// txWriter is what planning queues operations on: a Plan, or, for a plan's
// operations, a knftables.Transaction.
type txWriter interface {
	Add(knftables.Object)
	Delete(knftables.Object)
	Flush(knftables.Object)
}

var (
	_ txWriter = (*knftables.Transaction)(nil)
	_ txWriter = (*Plan)(nil)
)

// Verb is the kind of an operation of a Plan.
type Verb uint8

// The verbs of a Plan's operations, as knftables.Transaction has them.
const (
	AddVerb Verb = iota
	DeleteVerb
	FlushVerb
)

// Op is one operation of a Plan.
type Op struct {
	Verb   Verb
	Object knftables.Object
}

// Plan is what one sync does to the table, decided before anything is written:
// the operations, in order, that take the table from what the Syncer applied last
// to the desired ruleset, and the element operations that go as one netlink batch
// instead of through nft. The same Plan goes to whichever writers the Syncer was
// given (see WithNetlink), so an in-memory table and the kernel receive the same
// operations.
type Plan struct {
	// Full is true when the plan rewrites the whole table.
	Full bool
	// Ops are the operations of the nft transaction, in order.
	Ops []Op
	// Batch, when not nil, are element operations on sets and maps that may go
	// as one netlink batch: for a full plan, the elements of the sets and maps Ops
	// leaves alone (sent after Ops); for an incremental one, every operation of Ops
	// (sent instead of Ops).
	Batch []elementOps
	// BatchElements is the number of elements Batch deletes and adds.
	BatchElements int
	// batchFlushes is the number of sets and maps of a full plan's Batch that
	// already exist in the table (the batch flushes them first).
	batchFlushes int
	// lookup returns the definitions of the sets and maps Batch writes.
	lookup definitions
}

// Add queues the addition of o.
func (p *Plan) Add(o knftables.Object) { p.Ops = append(p.Ops, Op{AddVerb, o}) }

// Delete queues the deletion of o.
func (p *Plan) Delete(o knftables.Object) { p.Ops = append(p.Ops, Op{DeleteVerb, o}) }

// Flush queues the flush of o.
func (p *Plan) Flush(o knftables.Object) { p.Ops = append(p.Ops, Op{FlushVerb, o}) }

// Operations returns the number of operations the plan makes: those of Ops, and
// for a full plan with a batch, the batch's elements and flushes too. Each element
// counts as one operation, whichever way it goes.
func (p *Plan) Operations() int {
	if p.Full {
		return len(p.Ops) + p.BatchElements + p.batchFlushes
	}
	return len(p.Ops)
}

// queue queues the operations of Ops on tx, in order.
func (p *Plan) queue(tx txWriter) {
	for _, op := range p.Ops {
		switch op.Verb {
		case AddVerb:
			tx.Add(op.Object)
		case DeleteVerb:
			tx.Delete(op.Object)
		case FlushVerb:
			tx.Flush(op.Object)
		}
	}
}

// planFull returns the plan of a full sync over the existing objects of the table
// (nil when it does not exist): flush the chains, sets and maps that stay, add
// all of desired, delete what desired does not have, in one transaction. Sets and
// maps whose definition changed since the last sync (defs) are deleted and added
// again; dynamic ones keep their elements (the kernel's). The elements of the sets
// and maps of conts are left to the plan's netlink batch, which flushes and fills
// them after the transaction.
func planFull(desired *ruleset.Ruleset, existing map[string][]string, defs tableDefs, conts []*container) *Plan {
	p := &Plan{Full: true}
	skip := make(map[string]bool, len(conts))
	for _, c := range conts {
		skip[c.name] = true
	}
	p.Add(desired.TableObject())
	for _, name := range existing["chain"] {
		p.Flush(&knftables.Chain{Name: name})
	}
	for _, name := range existing["set"] {
		want := desired.Sets[name]
		switch {
		case want == nil:
			p.Flush(&knftables.Set{Name: name}) // and deleted below
		case changed(defs.sets, name, want):
			// A set cannot be re-added over one of another definition; it is added
			// again with the rest of the ruleset.
			p.Delete(&knftables.Set{Name: name})
		case !slices.Contains(want.Flags, knftables.DynamicFlag) && !skip[name]:
			p.Flush(&knftables.Set{Name: name})
		}
	}
	for _, name := range existing["map"] {
		want := desired.Maps[name]
		switch {
		case want == nil:
			p.Flush(&knftables.Map{Name: name})
		case changed(defs.maps, name, want):
			p.Delete(&knftables.Map{Name: name})
		case !slices.Contains(want.Flags, knftables.DynamicFlag) && !skip[name]:
			p.Flush(&knftables.Map{Name: name})
		}
	}
	addAll(p, desired, skip)
	for _, name := range existing["chain"] {
		if _, ok := desired.Chains[name]; !ok {
			p.Delete(&knftables.Chain{Name: name})
		}
	}
	for _, name := range existing["set"] {
		if _, ok := desired.Sets[name]; !ok {
			p.Delete(&knftables.Set{Name: name})
		}
	}
	for _, name := range existing["map"] {
		if _, ok := desired.Maps[name]; !ok {
			p.Delete(&knftables.Map{Name: name})
		}
	}
	p.withBatch(desired, conts)
	for _, name := range slices.Concat(existing["set"], existing["map"]) {
		if skip[name] {
			p.batchFlushes++
		}
	}
	return p
}

// planRecreate returns the plan of a full sync that deletes the table and creates
// it anew, in one transaction: the way out when the kernel refuses planFull's
// (an object of ours changed its definition in a way the Syncer did not know).
func planRecreate(desired *ruleset.Ruleset, conts []*container) *Plan {
	p := &Plan{Full: true}
	p.Add(desired.TableObject())
	p.Delete(desired.TableObject())
	skip := make(map[string]bool, len(conts))
	for _, c := range conts {
		skip[c.name] = true
	}
	addAll(p, desired, skip)
	p.withBatch(desired, conts)
	return p
}

// withBatch sets a full plan's batch: for each of conts, a flush, then its
// elements in desired.
func (p *Plan) withBatch(desired *ruleset.Ruleset, conts []*container) {
	if len(conts) == 0 {
		return
	}
	p.Batch = fullOps(desired, conts)
	p.lookup = definitionsOf(desired)
	for _, op := range p.Batch {
		p.BatchElements += op.n
	}
}

// addAll queues the whole of rs on p, as rs.AddTo does, without the elements of
// the sets and maps in skip.
func addAll(p *Plan, rs *ruleset.Ruleset, skip map[string]bool) {
	if len(skip) == 0 {
		rs.AddTo(p)
		return
	}
	some := *rs
	some.Elements = make(map[string]map[string]ruleset.Elem, len(rs.Elements))
	for cont, es := range rs.Elements {
		if !skip[cont] {
			some.Elements[cont] = es
		}
	}
	some.AddTo(p)
}

// planIncremental returns the plan that applies delta to the table, or nil when
// delta needs a full sync (see needsFull, keeper.conflicts). With a keeper (k
// non-nil), removed objects are emptied and kept; once more than keepLimit are
// kept, the same plan removes them. The plan's batch is set when every operation
// is an element operation that netlink carries (see elementBatch).
func planIncremental(applied, desired *ruleset.Ruleset, delta *changeset.Delta, k *keeper, keepLimit int) *Plan {
	if needsFull(applied, desired, delta) || k.conflicts(delta) {
		return nil
	}
	p := &Plan{}
	applyDelta(p, desired, delta, k)
	if k.count() > keepLimit {
		k.tidy(p, desired)
	}
	if ops, n, ok := p.elementBatch(desired, delta); ok && len(p.Ops) > 0 {
		p.Batch, p.BatchElements = ops, n
		p.lookup = func(name string) (*knftables.Set, *knftables.Map) { return definition(name, desired, delta) }
	}
	return p
}

// elementBatch returns the plan's operations as netlink element operations and
// the number of elements they delete and add, when every one of them adds or
// deletes an element, or flushes a set or map, of a set or map of desired (or one
// delta removes) whose elements the encoder handles; and when, within each set or
// map, a flush comes first and no deletion follows an addition (the batch writes
// a container's flush, deletions and additions in that order). It returns false
// otherwise.
func (p *Plan) elementBatch(desired *ruleset.Ruleset, delta *changeset.Delta) ([]elementOps, int, bool) {
	type pending struct {
		op       elementOps
		del, add []*knftables.Element
	}
	byName := map[string]*pending{}
	var order []string
	for _, rec := range p.Ops {
		var name string
		var elem *knftables.Element
		switch o := rec.Object.(type) {
		case *knftables.Element:
			name, elem = ruleset.Container(o), o
		case *knftables.Set:
			name = o.Name
		case *knftables.Map:
			name = o.Name
		default:
			return nil, 0, false
		}
		if (elem == nil) != (rec.Verb == FlushVerb) {
			return nil, 0, false
		}
		pe := byName[name]
		if pe == nil {
			c, err := containerOf(definition(name, desired, delta))
			if err != nil {
				return nil, 0, false
			}
			pe = &pending{op: elementOps{c: c}}
			byName[name] = pe
			order = append(order, name)
		}
		switch rec.Verb {
		case FlushVerb:
			if pe.op.flush || len(pe.del)+len(pe.add) > 0 {
				return nil, 0, false
			}
			pe.op.flush = true
		case DeleteVerb:
			if len(pe.add) > 0 {
				return nil, 0, false
			}
			pe.del = append(pe.del, elem)
		case AddVerb:
			pe.add = append(pe.add, elem)
		}
	}
	ops := make([]elementOps, 0, len(order))
	n := 0
	for _, name := range order {
		pe := byName[name]
		pe.op.del, pe.op.add, pe.op.n = slices.Values(pe.del), slices.Values(pe.add), len(pe.del)+len(pe.add)
		ops = append(ops, pe.op)
		n += pe.op.n
	}
	return ops, n, true
}

// definition returns the set or map name as desired has it, or as delta removes
// it (a kept container whose elements the sync deletes).
func definition(name string, desired *ruleset.Ruleset, delta *changeset.Delta) (*knftables.Set, *knftables.Map) {
	if s := desired.Sets[name]; s != nil {
		return s, nil
	}
	if m := desired.Maps[name]; m != nil {
		return nil, m
	}
	if c, ok := delta.Sets[name]; ok && c.Old != nil {
		return c.Old, nil
	}
	if c, ok := delta.Maps[name]; ok && c.Old != nil {
		return nil, c.Old
	}
	return nil, nil
}

// needsFull reports whether delta needs a full sync: the table changed identity, or
// a set, map or base chain kept its name but changed its definition, which nft
// cannot change in place.
func needsFull(old, desired *ruleset.Ruleset, delta *changeset.Delta) bool {
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
// while referenced. With a keeper (k non-nil), removed chains, sets and maps are
// emptied and kept rather than deleted, and dispatch chains only gain rules (see
// keeper).
func applyDelta(tx txWriter, desired *ruleset.Ruleset, delta *changeset.Delta, k *keeper) {
	chains := ruleset.SortedKeys(delta.Chains)
	// rewrite marks new chains that were kept with other rules; same, kept ones with
	// the very rules wanted.
	rewrite, same := map[string]bool{}, map[string]bool{}
	// 1. New containers.
	for _, name := range chains {
		c := delta.Chains[name]
		if c.Old != nil {
			continue
		}
		if old := k.takeChain(name); old != nil {
			if ruleset.SameChain(old, c.New) {
				same[name] = true
			} else {
				rewrite[name] = true
			}
			continue
		}
		tx.Add(desired.ChainObject(name))
	}
	for _, name := range ruleset.SortedKeys(delta.Sets) {
		if c := delta.Sets[name]; c.Old == nil && !k.takeSet(name) {
			tx.Add(desired.SetObject(name))
		}
	}
	for _, name := range ruleset.SortedKeys(delta.Maps) {
		if c := delta.Maps[name]; c.Old == nil && !k.takeMap(name) {
			tx.Add(desired.MapObject(name))
		}
	}
	// 2. Rules of new and changed chains.
	for _, name := range chains {
		c := delta.Chains[name]
		if c.New == nil || same[name] {
			continue
		}
		if k != nil && c.Old != nil && ruleset.IsDispatchChain(name) {
			k.appendMissing(tx, desired, name, k.kernelRules(name, c.Old), c.New)
			continue
		}
		if c.Old != nil || rewrite[name] {
			tx.Flush(desired.ChainObject(name))
		}
		desired.AddRulesTo(tx, name)
		if k != nil {
			delete(k.rules, name)
		}
	}
	// 3. Elements of containers that stay: deletions (removed or changed), then
	// additions. A container that goes away takes its elements with it, unless it is
	// kept: then they are deleted one by one (a kept dynamic set, whose elements are
	// the kernel's, is flushed).
	var adds []*knftables.Element
	for _, cont := range ruleset.SortedKeys(delta.Elements) {
		if k == nil && gone(delta, cont) {
			continue
		}
		if k != nil && dynamicGone(delta, cont) {
			continue
		}
		es := delta.Elements[cont]
		_, m := definition(cont, desired, delta)
		keys := ruleset.SortedKeys(es)
		for _, key := range keys {
			if old := es[key].Old; old != nil && !isNewContainer(delta, cont) {
				tx.Delete(desired.ElementObject(cont, m != nil, key, *old))
			}
		}
		for _, key := range keys {
			if e := es[key].New; e != nil {
				adds = append(adds, desired.ElementObject(cont, m != nil, key, *e))
			}
		}
	}
	for _, e := range adds {
		tx.Add(e)
	}
	// 4. Removed chains, sets and maps: deleted, or, with a keeper, kept.
	if k != nil {
		k.keepRemoved(tx, desired, delta)
		return
	}
	var chainsGone []knftables.Chain
	for _, name := range chains {
		if c := delta.Chains[name]; c.New == nil {
			chainsGone = append(chainsGone, c.Old.Chain)
		}
	}
	var setsGone, mapsGone []string
	for _, name := range ruleset.SortedKeys(delta.Sets) {
		if delta.Sets[name].New == nil {
			setsGone = append(setsGone, name)
		}
	}
	for _, name := range ruleset.SortedKeys(delta.Maps) {
		if delta.Maps[name].New == nil {
			mapsGone = append(mapsGone, name)
		}
	}
	removeObjects(tx, desired, chainsGone, setsGone, mapsGone)
}

// removeObjects queues the deletion of chains (all flushed first, as they may jump
// to each other), then of the sets and maps named, which only those chains or
// flushed rules referred to.
func removeObjects(tx txWriter, desired *ruleset.Ruleset, chains []knftables.Chain, sets, maps []string) {
	for i := range chains {
		ch := &chains[i]
		ch.Family, ch.Table, ch.Handle = desired.Family, desired.Table, nil
		tx.Flush(ch)
	}
	for i := range chains {
		tx.Delete(&chains[i])
	}
	for _, name := range sets {
		tx.Delete(&knftables.Set{Family: desired.Family, Table: desired.Table, Name: name})
	}
	for _, name := range maps {
		tx.Delete(&knftables.Map{Family: desired.Family, Table: desired.Table, Name: name})
	}
}

// dynamicGone reports whether cont is a dynamic set or map that delta removes: its
// elements are the kernel's, not the delta's.
func dynamicGone(delta *changeset.Delta, cont string) bool {
	if c, ok := delta.Sets[cont]; ok && c.New == nil {
		return slices.Contains(c.Old.Flags, knftables.DynamicFlag)
	}
	if c, ok := delta.Maps[cont]; ok && c.New == nil {
		return slices.Contains(c.Old.Flags, knftables.DynamicFlag)
	}
	return false
}

// gone reports whether the set or map named cont is removed by delta.
func gone(delta *changeset.Delta, cont string) bool {
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
func isNewContainer(delta *changeset.Delta, cont string) bool {
	if c, ok := delta.Sets[cont]; ok && c.Old == nil {
		return true
	}
	if c, ok := delta.Maps[cont]; ok && c.Old == nil {
		return true
	}
	return false
}

// deletes reports whether the plan deletes an element, chain, set or map.
func (p *Plan) deletes() bool {
	for _, op := range p.Ops {
		if op.Verb == DeleteVerb {
			return true
		}
	}
	for _, op := range p.Batch {
		if op.del != nil {
			for range op.del {
				return true
			}
		}
	}
	return false
}
