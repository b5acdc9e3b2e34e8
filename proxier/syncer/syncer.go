// Package syncer applies desired rulesets to an nftables table through
// knftables.Interface: a full sync first and whenever asked, otherwise an
// incremental transaction that holds only what changed since the last sync. With
// WithNetlinkElements, set and map elements go as nf_tables batches over netlink
// where that keeps each change atomic: the elements of full syncs, and incremental
// syncs that change elements only.
package syncer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"syscall"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
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
	// setDefs and mapDefs are the definitions of the sets and maps in the table as of
	// the last successful sync (kept apart from applied, which may change in place),
	// or nil when unknown: before the first sync, or after a failed one. A full sync
	// recreates the sets and maps whose definition changed from these.
	setDefs map[string]*knftables.Set
	mapDefs map[string]*knftables.Map
	// group is the most elements a full sync writes in one "add element" command.
	group int
	// keepLimit and keep: the emptied objects incremental syncs leave in the table
	// (keep is nil when keepLimit is 0).
	keepLimit int
	keep      *keeper
	// netlink makes syncs write set and map elements over netlink when they can
	// (see fullSync and apply); write sends them (writeElements, or a test's
	// stand-in), from a socket opened inside do.
	netlink bool
	do      func(func() error) error
	write   func(context.Context, *ruleset.Ruleset, []elementOps) (int, error)
	// structure identifies the table's chains, rules, sets and maps (not elements)
	// as of the last successful sync, or is "" when unknown (see structureOf).
	structure string
}

// Result describes one sync.
type Result struct {
	// Full is true when the sync rewrote the whole table.
	Full bool
	// Operations is the number of nft operations in the transaction (0 when
	// nothing changed and no transaction was run): objects added, flushed and
	// deleted, each set or map element counting as one operation even when a full
	// sync writes many elements in one "add element" command. It therefore does not
	// depend on the element grouping, and is what knftables.Transaction.NumOperations
	// reports for the same transaction written one element per command.
	Operations int
	// NetlinkElements is the number of elements the sync wrote over netlink rather
	// than through nft (they count in Operations too).
	NetlinkElements int
	// Fallback is why a sync went through nft after its netlink batch failed (nil
	// when it did not): a full sync then writes the whole table through nft, an
	// incremental one its delta; later syncs use nft only.
	Fallback error
	// AffinityMoves are the session-affinity record moves made after the
	// transaction (see changeset.AffinityMoves): none unless the endpoints of a
	// Service with session affinity changed.
	AffinityMoves []changeset.AffinityMove
}

// DefaultElementGroup is the number of set and map elements a full sync writes per
// "add element" command through a real nft (see New). A full sync of 50,000
// Services (386,561 elements; BenchmarkKernelFullSync, nft 1.0.6, mean of 3) took
// 10.4 s one element per command and 6.5 s grouped by 1000; with TuneNFT, 5.9 s and
// 3.3 s.
const DefaultElementGroup = 1000

// Option configures a Syncer.
type Option func(*Syncer)

// WithElementGroup makes full syncs write at most n set or map elements per
// "add element" command; n <= 1 writes one element per command, as knftables does.
func WithElementGroup(n int) Option {
	return func(s *Syncer) { s.group = max(n, 1) }
}

// WithNetlinkElements makes syncs write set and map elements over netlink — the
// elements of full syncs (see Syncer.fullSync), and incremental syncs that change
// elements only (see Syncer.Apply) — through a netlink socket opened inside do,
// which must run its argument in the network namespace where nft writes the table
// (nil: opened by the calling goroutine, for a process that stays in one
// namespace). The elements go to the table of that name there. It is off by
// default, and always off through an in-memory fake.
func WithNetlinkElements(do func(func() error) error) Option {
	return func(s *Syncer) { s.netlink, s.do = true, do }
}

// New returns a Syncer that applies rulesets through nft. Its first sync is full.
//
// Full syncs write set and map elements DefaultElementGroup to an "add element"
// command (incremental syncs write one element per command). They do so by handing
// knftables one Element whose Key holds the text of all elements of the command
// but the last (see groupElements), which a real nft reads like any other command
// but which a knftables.Fake, which parses elements itself, cannot take. So when
// nft is an in-memory fake — a *knftables.Fake or any type that has its Dump and
// ParseDump methods, such as a struct embedding one — elements are not grouped. A
// wrapper that hides a Fake behind other methods must pass WithElementGroup(1).
func New(nft knftables.Interface, opts ...Option) *Syncer {
	s := &Syncer{nft: nft, full: true, group: DefaultElementGroup, keepLimit: DefaultKeepLimit}
	s.write = func(ctx context.Context, rs *ruleset.Ruleset, ops []elementOps) (int, error) {
		return writeElements(ctx, rs, ops, s.do)
	}
	fake := isFake(nft)
	if fake {
		s.group, s.keepLimit = 1, 0
	}
	for _, o := range opts {
		o(s)
	}
	if fake {
		s.netlink = false
	}
	if s.keepLimit > 0 {
		s.keep = newKeeper()
	}
	return s
}

// isFake reports whether nft is a knftables.Fake or embeds one.
func isFake(nft knftables.Interface) bool {
	_, ok := nft.(interface {
		Dump() string
		ParseDump(string) error
	})
	return ok
}

// RequestFullSync makes the next Sync a full one, which repairs any drift between
// the kernel and what the Syncer believes it applied (a periodic resync calls this).
func (s *Syncer) RequestFullSync() { s.full = true }

// Netlink reports whether syncs write elements over netlink when they can (see
// WithNetlinkElements): on when the Syncer was made so, until a netlink batch
// fails.
func (s *Syncer) Netlink() bool { return s.netlink }

// Applied returns the ruleset applied by the last successful sync, or nil.
func (s *Syncer) Applied() *ruleset.Ruleset { return s.applied }

// Sync makes the table equal to desired, diffing it against what was applied last
// (O(size of the ruleset) in CPU, O(changes) in nft operations). The Syncer keeps
// desired as the applied state, so callers must not modify it afterwards.
func (s *Syncer) Sync(ctx context.Context, desired *ruleset.Ruleset) (Result, error) {
	var delta *changeset.Delta
	if s.applied != nil && !s.live {
		delta = changeset.Diff(s.applied, desired)
	}
	moves := s.plannedMoves(ctx, desired, delta)
	var res Result
	var err error
	if s.full || s.applied == nil || s.live {
		res, err = s.fullSync(ctx, desired)
	} else {
		res, err = s.apply(ctx, desired, delta)
	}
	return s.finish(ctx, desired, res, err, moves)
}

// Apply makes the table equal to desired, given delta, what changed in desired
// since the last Apply: the output of changeset.Builder.Update. Its cost is O(delta),
// whatever the size of the ruleset. desired may keep changing between calls (it is
// the Builder's own ruleset); a Syncer fed by Apply must not also be fed by Sync.
// When a full sync is due (the first sync, after RequestFullSync or a failure),
// delta is ignored and the whole of desired is written.
func (s *Syncer) Apply(ctx context.Context, desired *ruleset.Ruleset, delta *changeset.Delta) (Result, error) {
	moves := s.plannedMoves(ctx, desired, delta)
	if s.full || s.applied == nil || delta == nil {
		res, err := s.fullSync(ctx, desired)
		s.live = err == nil
		return s.finish(ctx, desired, res, err, moves)
	}
	s.live = true
	res, err := s.apply(ctx, desired, delta)
	return s.finish(ctx, desired, res, err, moves)
}

// plannedMoves returns the session-affinity record moves the coming sync of desired
// needs (see changeset.AffinityMoves), with the records they move listed: from delta,
// or, before the first sync, from the affinity maps a previous proxier left in the
// kernel, which must be read before the sync overwrites them. It plans nothing when
// neither is known or the kernel cannot be read; the sync goes on regardless.
func (s *Syncer) plannedMoves(ctx context.Context, desired *ruleset.Ruleset, delta *changeset.Delta) *affinityPlan {
	var moves []changeset.AffinityMove
	switch {
	case s.applied == nil:
		maps, err := s.nft.List(ctx, "maps")
		if err != nil {
			return nil // no table yet: nothing to keep
		}
		if moves, err = s.kernelAffinityMoves(ctx, desired, maps); err != nil {
			return nil
		}
	case delta != nil:
		moves = changeset.AffinityMoves(desired, delta)
	}
	if len(moves) == 0 {
		return nil
	}
	plan, err := s.listAffinity(ctx, moves)
	if err != nil {
		return nil
	}
	return plan
}

// finish makes the planned affinity moves once the sync itself succeeded, and
// reports them in the Result.
func (s *Syncer) finish(ctx context.Context, desired *ruleset.Ruleset, res Result, err error, plan *affinityPlan) (Result, error) {
	if err != nil || plan == nil {
		return res, err
	}
	res.AffinityMoves = plan.moves
	if err := s.moveAffinity(ctx, desired, plan); err != nil {
		return res, fmt.Errorf("table %s %s: %w", desired.Family, desired.Table, err)
	}
	return res, nil
}

// apply sends delta as one transaction, or a full sync when delta changes an
// object's definition in a way nft cannot update in place.
func (s *Syncer) apply(ctx context.Context, desired *ruleset.Ruleset, delta *changeset.Delta) (Result, error) {
	if needsFull(s.applied, desired, delta) || s.keep.conflicts(delta) {
		return s.fullSync(ctx, desired)
	}
	rec := &recorder{}
	applyDelta(rec, desired, delta, s.keep)
	if s.keep.count() > s.keepLimit {
		s.keep.tidy(rec, desired)
	}
	if len(rec.ops) == 0 {
		s.applied = desired
		return Result{}, nil
	}
	res, sent := s.applyOverNetlink(ctx, desired, delta, rec)
	if !sent {
		tx := s.nft.NewTransaction()
		rec.replay(tx)
		res.Operations = tx.NumOperations()
		if err := s.nft.Run(ctx, tx); err != nil {
			s.full = true
			s.forgetDefs()
			return res, fmt.Errorf("incremental sync of table %s %s (%d operations): %w", desired.Family, desired.Table, res.Operations, err)
		}
	}
	s.applied = desired
	if s.netlink && (len(delta.Chains) > 0 || len(delta.Sets) > 0 || len(delta.Maps) > 0) {
		s.structure = structureOf(desired)
	}
	for name, c := range delta.Sets {
		if c.New == nil {
			delete(s.setDefs, name)
		} else if s.setDefs != nil {
			s.setDefs[name] = c.New
		}
	}
	for name, c := range delta.Maps {
		if c.New == nil {
			delete(s.mapDefs, name)
		} else if s.mapDefs != nil {
			s.mapDefs[name] = c.New
		}
	}
	return res, nil
}

// applyOverNetlink sends the operations rec recorded as one netlink batch, when
// netlink is on and they are element operations only (see recorder.elementOps),
// and reports whether it did. When the batch fails, which applies none of it, it
// turns netlink off and returns the error as the Result's Fallback: the caller
// sends the operations through nft.
func (s *Syncer) applyOverNetlink(ctx context.Context, desired *ruleset.Ruleset, delta *changeset.Delta, rec *recorder) (Result, bool) {
	if !s.netlink {
		return Result{}, false
	}
	ops, n, ok := rec.elementOps(desired, delta)
	if !ok {
		return Result{}, false
	}
	if _, err := s.write(ctx, desired, ops); err != nil {
		s.netlink = false
		return Result{Fallback: fmt.Errorf("writing %d elements of table %s %s over netlink: %w", n, desired.Family, desired.Table, err)}, false
	}
	return Result{Operations: len(rec.ops), NetlinkElements: n}, true
}

// Tidy removes the emptied objects incremental syncs kept in the table (see
// WithKeepLimit), so that it holds exactly the ruleset applied last. It runs no
// transaction when there are none.
func (s *Syncer) Tidy(ctx context.Context) (Result, error) {
	if s.keep == nil || s.applied == nil || (s.keep.count() == 0 && len(s.keep.rules) == 0) {
		return Result{}, nil
	}
	tx := s.nft.NewTransaction()
	s.keep.tidy(tx, s.applied)
	res := Result{Operations: tx.NumOperations()}
	if err := s.nft.Run(ctx, tx); err != nil {
		s.full = true
		s.forgetDefs()
		return res, fmt.Errorf("removing the emptied objects of table %s %s: %w", s.applied.Family, s.applied.Table, err)
	}
	return res, nil
}

// forgetDefs marks the definitions of the table's sets and maps unknown: after a
// failed nft run, the Syncer cannot tell whether the kernel took the transaction.
func (s *Syncer) forgetDefs() { s.setDefs, s.mapDefs, s.structure = nil, nil, "" }

// fullSync rewrites the table: existing chains, sets and maps are flushed, the desired
// ruleset is added, and objects that are no longer wanted are deleted — all in one
// atomic transaction. Should the kernel refuse it (an object of ours changed its
// definition), the table is deleted and created anew in one transaction instead.
//
// Sets and maps with the dynamic flag are not flushed: their elements are the
// kernel's (session-affinity records, added by "update @set" rules), and the
// desired ruleset holds none. They are recreated, losing those elements, only when
// their definition changed since the last successful sync. When the Syncer does not
// know what it applied last (a restarted proxier adopting a table, or after a failed
// sync), a dynamic set keeps its elements, and its "add set" either updates the
// definition in place (the kernel does so for the timeout) or fails on a changed type
// or flags, which takes the fallback that recreates the table. (Linux 6.18 updates
// a set's timeout in place; older kernels may keep the old timeout.)
//
// With netlink loading on (WithNetlinkElements), when the table has no chains yet
// or its chains, rules, sets and maps are those of desired (as the Syncer applied
// them last), the elements of the sets and maps go over netlink instead: nft
// writes everything else, then one netlink batch flushes those sets and maps and
// adds their elements, atomically. Between the two the rules are those wanted, and
// the elements of the last sync stay in place. Otherwise — a restarted proxier
// adopting a table, or a full sync that changes rules — the single nft transaction
// keeps the switch atomic. Should the netlink load fail, the whole table is written
// through nft after all (Result.Fallback says why), and later full syncs use nft
// only.
func (s *Syncer) fullSync(ctx context.Context, desired *ruleset.Ruleset) (Result, error) {
	existing, err := s.listExisting(ctx, desired)
	if err != nil {
		return Result{Full: true}, err
	}
	var conts []*container
	var structure string
	if s.netlink {
		structure = structureOf(desired)
		if len(existing["chain"]) == 0 || s.structure == structure {
			conts = netlinkContainers(desired)
		}
	}
	skip := make(map[string]bool, len(conts))
	for _, c := range conts {
		skip[c.name] = true
	}
	res, err := s.writeAll(ctx, desired, existing, skip)
	if err == nil && len(conts) > 0 {
		n, lerr := s.write(ctx, desired, fullOps(desired, conts))
		if lerr == nil {
			res.NetlinkElements = n
			res.Operations += n
			for _, name := range slices.Concat(existing["set"], existing["map"]) {
				if skip[name] {
					res.Operations++ // its flush
				}
			}
		} else {
			lerr = fmt.Errorf("loading %d elements into %d sets and maps of table %s %s over netlink: %w",
				n, len(conts), desired.Family, desired.Table, lerr)
			s.netlink = false
			if existing, err = s.listExisting(ctx, desired); err == nil {
				res, err = s.writeAll(ctx, desired, existing, nil)
			}
			res.Fallback = lerr
			if err != nil {
				err = fmt.Errorf("%w (after the netlink element load failed: %v)", err, lerr)
			}
		}
	}
	if err != nil {
		return res, err
	}
	s.applied = desired
	s.full = false
	s.keep.reset()
	s.setDefs, s.mapDefs = maps.Clone(desired.Sets), maps.Clone(desired.Maps)
	if s.setDefs == nil {
		s.setDefs = map[string]*knftables.Set{}
	}
	if s.mapDefs == nil {
		s.mapDefs = map[string]*knftables.Map{}
	}
	if s.netlink {
		s.structure = structure
	}
	return res, nil
}

// listExisting lists the objects of desired's table in the kernel: nil when there
// is no such table.
func (s *Syncer) listExisting(ctx context.Context, desired *ruleset.Ruleset) (map[string][]string, error) {
	existing, err := s.nft.ListAll(ctx)
	if err != nil && !notFound(err) {
		s.full = true
		return nil, fmt.Errorf("full sync of table %s %s: listing existing objects: %w", desired.Family, desired.Table, err)
	}
	if existing != nil {
		existing["set"], existing["map"] = named(existing["set"]), named(existing["map"])
	}
	return existing, nil
}

// writeAll runs the transaction of a full sync over the existing objects: all of
// desired but the elements of the sets and maps in skip, which it leaves alone
// (they are loaded over netlink). Should it fail, it deletes and recreates the
// table instead.
func (s *Syncer) writeAll(ctx context.Context, desired *ruleset.Ruleset, existing map[string][]string, skip map[string]bool) (Result, error) {
	tx := s.nft.NewTransaction()
	tx.Add(desired.TableObject())
	for _, name := range existing["chain"] {
		tx.Flush(&knftables.Chain{Name: name})
	}
	for _, name := range existing["set"] {
		want := desired.Sets[name]
		switch {
		case want == nil:
			tx.Flush(&knftables.Set{Name: name}) // and deleted below
		case changed(s.setDefs, name, want):
			// A set cannot be re-added over one of another definition; it is added
			// again with the rest of the ruleset.
			tx.Delete(&knftables.Set{Name: name})
		case !slices.Contains(want.Flags, knftables.DynamicFlag) && !skip[name]:
			tx.Flush(&knftables.Set{Name: name})
		}
	}
	for _, name := range existing["map"] {
		want := desired.Maps[name]
		switch {
		case want == nil:
			tx.Flush(&knftables.Map{Name: name})
		case changed(s.mapDefs, name, want):
			tx.Delete(&knftables.Map{Name: name})
		case !slices.Contains(want.Flags, knftables.DynamicFlag) && !skip[name]:
			tx.Flush(&knftables.Map{Name: name})
		}
	}
	merged := s.addAll(tx, desired, skip)
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
	res := Result{Full: true, Operations: tx.NumOperations() + merged}
	if err := s.nft.Run(ctx, tx); err != nil {
		// Recreate the table from scratch, atomically.
		tx = s.nft.NewTransaction()
		tx.Add(desired.TableObject())
		tx.Delete(desired.TableObject())
		merged = s.addAll(tx, desired, skip)
		res.Operations = tx.NumOperations() + merged
		if err2 := s.nft.Run(ctx, tx); err2 != nil {
			s.full = true
			s.applied = nil
			s.forgetDefs()
			return res, fmt.Errorf("full sync of table %s %s: %w (recreating the table: %v)", desired.Family, desired.Table, err, err2)
		}
	}
	return res, nil
}

// structureOf identifies the chains, rules, sets and maps of rs, leaving out the
// elements: a digest of the nft commands that create them. It costs O(chains +
// rules + sets + maps), which does not grow with the number of Services.
func structureOf(rs *ruleset.Ruleset) string {
	bare := *rs
	bare.Elements = nil
	tx := knftables.NewFake(rs.Family, rs.Table).NewTransaction()
	bare.AddTo(tx)
	sum := sha256.Sum256([]byte(tx.String()))
	return string(sum[:])
}

// netlinkContainers returns the sets and maps of rs whose elements a full sync
// can load over netlink: those that are not dynamic (their elements are the
// kernel's) and whose elements the loader encodes (see containerOf).
func netlinkContainers(rs *ruleset.Ruleset) []*container {
	var conts []*container
	for _, name := range ruleset.SortedKeys(rs.Sets) {
		set := rs.Sets[name]
		if slices.Contains(set.Flags, knftables.DynamicFlag) {
			continue
		}
		if c, err := containerOf(set, nil); err == nil {
			conts = append(conts, c)
		}
	}
	for _, name := range ruleset.SortedKeys(rs.Maps) {
		m := rs.Maps[name]
		if slices.Contains(m.Flags, knftables.DynamicFlag) {
			continue
		}
		if c, err := containerOf(nil, m); err == nil {
			conts = append(conts, c)
		}
	}
	return conts
}

// named drops the anonymous sets and maps (__set0, __map3: the kernel's names for
// the "{ tcp, udp }" and "vmap { … }" of rules) from a listing: nft leaves them out
// when it lists a table, the netlink listing does not, and they go with their rules.
func named(names []string) []string {
	return slices.DeleteFunc(names, func(n string) bool {
		return strings.HasPrefix(n, "__set") || strings.HasPrefix(n, "__map")
	})
}

// notFound reports whether err says the table does not exist, as nft reports it or,
// when knftables lists over netlink (knftables.UseNetlink), as the kernel does:
// google/nftables returns that as text ("receiveAckAware: netlink receive: no such
// file or directory"), without the errno to match.
func notFound(err error) bool {
	return knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT) ||
		strings.HasSuffix(err.Error(), ": "+syscall.ENOENT.Error())
}

// changed reports whether the set or map name was applied last with a definition
// other than want. It reports false when the last definition is unknown.
func changed[T any](defs map[string]*T, name string, want *T) bool {
	old, ok := defs[name]
	return ok && !reflect.DeepEqual(old, want)
}

// addAll queues the whole of rs on tx, as rs.AddTo does, but with the elements
// grouped s.group to a command, and without those of the sets and maps in skip.
// It returns the number of elements written in a command of an earlier element,
// to be added to tx.NumOperations() for the count of operations.
func (s *Syncer) addAll(tx *knftables.Transaction, rs *ruleset.Ruleset, skip map[string]bool) (merged int) {
	bare := *rs
	bare.Elements = nil
	bare.AddTo(tx) // the table, chains, sets, maps and rules, in AddTo's order
	var b strings.Builder
	for _, cont := range ruleset.SortedKeys(rs.Elements) {
		if skip[cont] {
			continue
		}
		es := rs.Elements[cont]
		keys := ruleset.SortedKeys(es)
		for len(keys) > 0 {
			n := min(len(keys), max(s.group, 1))
			tx.Add(groupElements(&b, rs, es, keys[:n]))
			merged += n - 1
			keys = keys[n:]
		}
	}
	return merged
}

// groupElements returns one knftables Element that adds the elements of es named
// by keys, all of one set or map, in a single command. knftables writes an element
// as
//
//	add element FAMILY TABLE NAME { KEY [comment "COMMENT"] [: VALUE] }
//
// so the returned Element is the last element with its Key replaced by the text of
// all the others, followed by its own key:
//
//	Key: ["k1 comment \"c1\" : v1, k2 : v2, ..., kN"], Comment: cN, Value: vN
//
// which makes the command "add element FAMILY TABLE NAME { k1 comment "c1" : v1,
// k2 : v2, ..., kN comment "cN" : vN }". Each element is written as knftables
// writes it (keys and values joined with " . ", the comment quoted with %q).
// b is scratch space.
func groupElements(b *strings.Builder, rs *ruleset.Ruleset, es map[string]*knftables.Element, keys []string) *knftables.Element {
	last := rs.ElementObject(es[keys[len(keys)-1]])
	if len(keys) == 1 {
		return last
	}
	b.Reset()
	for _, k := range keys[:len(keys)-1] {
		writeElement(b, es[k])
		b.WriteString(", ")
	}
	b.WriteString(ruleset.ElementKey(last))
	last.Key = []string{b.String()}
	return last
}

// writeElement writes e as knftables's Element.writeOperation writes it between
// the braces of an "add element" command.
func writeElement(b *strings.Builder, e *knftables.Element) {
	b.WriteString(ruleset.ElementKey(e))
	if e.Comment != nil {
		fmt.Fprintf(b, " comment %q", *e.Comment)
	}
	if len(e.Value) != 0 {
		b.WriteString(" : ")
		b.WriteString(strings.Join(e.Value, " . "))
	}
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
		for _, key := range ruleset.SortedKeys(es) {
			if old := es[key].Old; old != nil && !isNewContainer(delta, cont) {
				tx.Delete(desired.ElementObject(old))
			}
		}
		for _, key := range ruleset.SortedKeys(es) {
			if e := es[key].New; e != nil {
				adds = append(adds, e)
			}
		}
	}
	for _, e := range adds {
		tx.Add(desired.ElementObject(e))
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
