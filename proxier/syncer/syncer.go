// Package syncer applies desired rulesets to an nftables table: it plans each
// sync (a full one first and whenever asked, otherwise only what changed since the
// last one) as a Plan, and hands the Plan to its writers: an nft transaction
// through knftables.Interface and, with WithNetlink, nf_tables netlink batches for
// set and map elements, where that keeps each change atomic.
package syncer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
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
	// defs are the definitions of the sets and maps in the table as of the last
	// successful sync (kept apart from applied, which may change in place), or nil
	// maps when unknown: before the first sync, or after a failed one. A full sync
	// recreates the sets and maps whose definition changed from these.
	defs tableDefs
	// keepLimit and keep: the emptied objects incremental syncs leave in the table
	// (keep is nil when keepLimit is 0).
	keepLimit int
	keep      *keeper
	// transport carries netlink element batches (nil: everything goes through
	// nft); it is dropped after a batch fails.
	transport Transport
	// structure identifies the table's chains, rules, sets and maps (not elements)
	// as of the last successful sync, or is "" when unknown (see Syncer.structureOf).
	structure string
	// sealed stands for the applied ruleset after Seal (applied is then nil).
	sealed *seal
	// gens follows the namespace's nf_tables generation (nil: every full sync
	// rewrites the table); commits counts the transactions the current sync
	// committed.
	gens    *Generations
	commits int
}

// tableDefs are the definitions of a table's sets and maps, by name.
type tableDefs struct {
	sets map[string]*knftables.Set
	maps map[string]*knftables.Map
}

// Result describes one sync.
type Result struct {
	// Full is true when the sync rewrote the whole table.
	Full bool
	// Operations is the number of operations the sync made (0 when nothing changed
	// and nothing was written): objects added, flushed and deleted, each set or
	// map element counting as one, whether it went through nft or over netlink.
	Operations int
	// NetlinkElements is the number of elements the sync wrote over netlink rather
	// than through nft (they count in Operations too).
	NetlinkElements int
	// Deleted is true when the sync deleted something from the table: an element,
	// or a chain, set or map (flushes not counted).
	Deleted bool
	// Verified is true when a full sync was due (RequestFullSync) and the
	// namespace's nf_tables generation showed the table as the Syncer last wrote
	// it, so that the sync wrote only what changed (see Generations); Full is
	// then false.
	Verified bool
	// Fallback is why a sync went through nft after its netlink batch failed (nil
	// when it did not): a full sync then writes the whole table through nft, an
	// incremental one its operations; later syncs use nft only.
	Fallback error
	// AffinityMoves are the session-affinity record moves made after the
	// transaction (see changeset.AffinityMoves): none unless the endpoints of a
	// Service with session affinity changed.
	AffinityMoves []changeset.AffinityMove
}

// Option configures a Syncer.
type Option func(*Syncer)

// WithNetlink makes syncs write set and map elements as nf_tables batches through
// t — the elements of full syncs (see Syncer.fullSync), and incremental syncs that
// change elements only (see Syncer.Apply) — rather than through nft. t must reach
// the table nft writes: KernelNetlink in nft's network namespace, or DecodedNetlink
// of the same knftables.Interface. Without it, every operation goes through nft.
func WithNetlink(t Transport) Option {
	return func(s *Syncer) { s.transport = t }
}

// New returns a Syncer that applies rulesets through nft, and through the
// writers its options add. Its first sync is full.
func New(nft knftables.Interface, opts ...Option) *Syncer {
	s := &Syncer{nft: nft, full: true, keepLimit: DefaultKeepLimit}
	for _, o := range opts {
		o(s)
	}
	if s.keepLimit > 0 {
		s.keep = newKeeper()
	}
	return s
}

// RequestFullSync makes the next Sync a full one, which repairs any drift between
// the kernel and what the Syncer believes it applied (a periodic resync calls this).
func (s *Syncer) RequestFullSync() { s.full = true }

// Netlink reports whether syncs write elements over netlink when they can (see
// WithNetlink): on when the Syncer was made so, until a netlink batch fails.
func (s *Syncer) Netlink() bool { return s.transport != nil }

// Close releases what the Syncer holds open: the netlink socket of a KernelNetlink
// transport. The Syncer stays usable; its next netlink batch opens a new socket.
func (s *Syncer) Close() error {
	if c, ok := s.transport.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Applied returns the ruleset applied by the last successful sync, or nil.
func (s *Syncer) Applied() *ruleset.Ruleset { return s.applied }

// Sync makes the table equal to desired, diffing it against what was applied last
// (O(size of the ruleset) in CPU, O(changes) in nft operations). The Syncer keeps
// desired as the applied state, so callers must not modify it afterwards.
func (s *Syncer) Sync(ctx context.Context, desired *ruleset.Ruleset) (Result, error) {
	gs := s.beginSync(ctx)
	if s.sealed != nil && s.takeOver(desired) {
		s.endSync(ctx, gs, false, false)
		return Result{}, nil
	}
	var delta *changeset.Delta
	if s.applied != nil && !s.live {
		delta = changeset.Diff(s.applied, desired)
	}
	moves := s.plannedMoves(ctx, desired, delta)
	var res Result
	var err error
	switch {
	case s.applied == nil || s.live || s.full && !s.verified(gs):
		res, err = s.fullSync(ctx, desired)
	default:
		res, err = s.applyDue(ctx, desired, delta)
	}
	res, err = s.finish(ctx, desired, res, err, moves)
	s.endSync(ctx, gs, res.Full && err == nil, err != nil)
	return res, err
}

// applyDue is apply for an incremental sync, or for a full sync due that
// Syncer.verified let write only what changed.
func (s *Syncer) applyDue(ctx context.Context, desired *ruleset.Ruleset, delta *changeset.Delta) (Result, error) {
	due := s.full
	res, err := s.apply(ctx, desired, delta)
	if due && err == nil && !res.Full {
		res.Verified, s.full = true, false
	}
	return res, err
}

// Apply makes the table equal to desired, given delta, what changed in desired
// since the last Apply: the output of changeset.Builder.Update. Its cost is O(delta),
// whatever the size of the ruleset. desired may keep changing between calls (it is
// the Builder's own ruleset); a Syncer fed by Apply must not also be fed by Sync.
// When a full sync is due (the first sync, after RequestFullSync or a failure),
// delta is ignored and the whole of desired is written.
func (s *Syncer) Apply(ctx context.Context, desired *ruleset.Ruleset, delta *changeset.Delta) (Result, error) {
	gs := s.beginSync(ctx)
	if s.sealed != nil {
		s.sealed, s.full = nil, true
	}
	moves := s.plannedMoves(ctx, desired, delta)
	var res Result
	var err error
	if s.applied == nil || delta == nil || s.full && !s.verified(gs) {
		res, err = s.fullSync(ctx, desired)
		s.live = err == nil
	} else {
		s.live = true
		res, err = s.applyDue(ctx, desired, delta)
	}
	res, err = s.finish(ctx, desired, res, err, moves)
	s.endSync(ctx, gs, res.Full && err == nil, err != nil)
	return res, err
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

// apply plans delta and writes the plan, or takes a full sync when delta changes
// an object's definition in a way nft cannot update in place.
func (s *Syncer) apply(ctx context.Context, desired *ruleset.Ruleset, delta *changeset.Delta) (Result, error) {
	p := planIncremental(s.applied, desired, delta, s.keep, s.keepLimit)
	if p == nil {
		return s.fullSync(ctx, desired)
	}
	if len(p.Ops) == 0 {
		s.applied = desired
		return Result{}, nil
	}
	res := Result{Operations: p.Operations(), Deleted: p.deletes()}
	sent := false
	if p.Batch != nil && s.transport != nil {
		if err := s.sendBatch(ctx, desired, p); err != nil {
			res.Fallback = err
		} else {
			sent, res.NetlinkElements = true, p.BatchElements
		}
	}
	if !sent {
		if err := s.run(ctx, p); err != nil {
			s.full = true
			s.forgetDefs()
			return res, fmt.Errorf("incremental sync of table %s %s (%d operations): %w", desired.Family, desired.Table, res.Operations, err)
		}
	}
	s.applied = desired
	if s.transport != nil && (len(delta.Chains) > 0 || len(delta.Sets) > 0 || len(delta.Maps) > 0) {
		s.structure = s.structureOf(desired)
	}
	for name, c := range delta.Sets {
		if c.New == nil {
			delete(s.defs.sets, name)
		} else if s.defs.sets != nil {
			s.defs.sets[name] = c.New
		}
	}
	for name, c := range delta.Maps {
		if c.New == nil {
			delete(s.defs.maps, name)
		} else if s.defs.maps != nil {
			s.defs.maps[name] = c.New
		}
	}
	return res, nil
}

// run writes the operations of p through nft, as one transaction.
func (s *Syncer) run(ctx context.Context, p *Plan) error {
	tx := s.nft.NewTransaction()
	p.queue(tx)
	if err := s.nft.Run(ctx, tx); err != nil {
		return err
	}
	s.commits++
	return nil
}

// sendBatch writes the batch of p over netlink. When the batch fails, which
// applies none of it, it drops the transport, so that later syncs use nft only, and
// returns why.
func (s *Syncer) sendBatch(ctx context.Context, desired *ruleset.Ruleset, p *Plan) error {
	if err := writeElements(ctx, desired, p.Batch, s.transport, p.lookup); err != nil {
		s.transport = nil
		return fmt.Errorf("writing %d elements into %d sets and maps of table %s %s over netlink: %w",
			p.BatchElements, len(p.Batch), desired.Family, desired.Table, err)
	}
	s.commits++
	return nil
}

// Tidy removes the emptied objects incremental syncs kept in the table (see
// WithKeepLimit), so that it holds exactly the ruleset applied last. It runs no
// transaction when there are none.
func (s *Syncer) Tidy(ctx context.Context) (Result, error) {
	if s.keep == nil || s.applied == nil || (s.keep.count() == 0 && len(s.keep.rules) == 0) {
		return Result{}, nil
	}
	p := &Plan{}
	s.keep.tidy(p, s.applied)
	res := Result{Operations: p.Operations(), Deleted: p.deletes()}
	gs := s.beginSync(ctx)
	err := s.run(ctx, p)
	s.endSync(ctx, gs, false, err != nil)
	if err != nil {
		s.full = true
		s.forgetDefs()
		return res, fmt.Errorf("removing the emptied objects of table %s %s: %w", s.applied.Family, s.applied.Table, err)
	}
	return res, nil
}

// forgetDefs marks the definitions of the table's sets and maps unknown: after a
// failed nft run, the Syncer cannot tell whether the kernel took the transaction.
func (s *Syncer) forgetDefs() { s.defs, s.structure = tableDefs{}, "" }

// fullSync rewrites the table (see planFull): existing chains, sets and maps are
// flushed, the desired ruleset is added, and objects that are no longer wanted are
// deleted — all in one atomic transaction. Should the kernel refuse it (an object
// of ours changed its definition), the table is deleted and created anew in one
// transaction instead (planRecreate).
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
// With a netlink transport (WithNetlink), when the table has no chains yet or its
// chains, rules, sets and maps are those of desired (as the Syncer applied them
// last), or the Syncer does not know what the table holds and it has every chain,
// set and map of desired (see covers: a restarted proxier adopting a table), the
// elements of the sets and maps go over netlink instead: nft writes everything
// else, then one netlink batch flushes those sets and maps and adds their
// elements, atomically. Between the two the rules are those wanted, and the
// elements of the last sync stay in place. Otherwise — a full sync that changes
// rules, or an adopted table that lacks some object — the single nft transaction
// keeps the switch atomic. Should the netlink batch fail, the whole table is written through
// nft after all (Result.Fallback says why), and later syncs use nft only.
func (s *Syncer) fullSync(ctx context.Context, desired *ruleset.Ruleset) (Result, error) {
	existing, err := s.listExisting(ctx, desired)
	if err != nil {
		return Result{Full: true}, err
	}
	var conts []*container
	var structure string
	if s.transport != nil {
		structure = s.structureOf(desired)
		if len(existing["chain"]) == 0 || s.structure == structure || (s.structure == "" && covers(existing, desired)) {
			conts = netlinkContainers(desired)
		}
	}
	res, err := s.writeFull(ctx, desired, existing, conts)
	if err != nil {
		return res, err
	}
	s.applied = desired
	s.full = false
	s.keep.reset()
	s.defs = tableDefs{sets: maps.Clone(desired.Sets), maps: maps.Clone(desired.Maps)}
	if s.defs.sets == nil {
		s.defs.sets = map[string]*knftables.Set{}
	}
	if s.defs.maps == nil {
		s.defs.maps = map[string]*knftables.Map{}
	}
	if s.transport != nil {
		s.structure = structure
	}
	return res, nil
}

// writeFull writes the plan of a full sync over the existing objects, with the
// elements of conts over netlink, and falls back as fullSync describes.
func (s *Syncer) writeFull(ctx context.Context, desired *ruleset.Ruleset, existing map[string][]string, conts []*container) (Result, error) {
	p := planFull(desired, existing, s.defs, conts)
	if err := s.run(ctx, p); err != nil {
		p = planRecreate(desired, conts)
		if err2 := s.run(ctx, p); err2 != nil {
			s.full = true
			s.applied = nil
			s.forgetDefs()
			return Result{Full: true, Operations: p.Operations()}, fmt.Errorf("full sync of table %s %s: %w (recreating the table: %v)", desired.Family, desired.Table, err, err2)
		}
	}
	res := Result{Full: true, Operations: p.Operations(), Deleted: p.deletes()}
	if p.Batch == nil {
		return res, nil
	}
	if lerr := s.sendBatch(ctx, desired, p); lerr != nil {
		existing, err := s.listExisting(ctx, desired)
		if err == nil {
			res, err = s.writeFull(ctx, desired, existing, nil)
		}
		res.Fallback = lerr
		if err != nil {
			err = fmt.Errorf("%w (after the netlink element load failed: %v)", err, lerr)
		}
		return res, err
	}
	res.NetlinkElements = p.BatchElements
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

// covers reports whether the table's objects existing include every chain, set and
// map of desired, so that a full sync adds none: then a Syncer that does not know
// what the table holds (a restarted proxier adopting it, or after a failed sync)
// writes the elements over netlink after nft's step rather than in it. Between the
// two steps the table has desired's rules and the elements it had, in sets and maps
// of the same names and definitions (nft refuses to re-add a set or map of another
// type, which takes the fallback that recreates the table in one transaction), as
// when the previous proxier, of the same layout, wrote them; the objects the table
// holds beyond desired's, which nft deletes in its step, are the emptied ones
// incremental syncs keep. At 50,000 Services this is what takes an adopting sync
// from one nft transaction of 746k elements (12 s) to seconds.
func covers(existing map[string][]string, desired *ruleset.Ruleset) bool {
	for _, kind := range []struct {
		kind  string
		names []string
	}{
		{"chain", slices.Collect(maps.Keys(desired.Chains))},
		{"set", slices.Collect(maps.Keys(desired.Sets))},
		{"map", slices.Collect(maps.Keys(desired.Maps))},
	} {
		have := make(map[string]bool, len(existing[kind.kind]))
		for _, n := range existing[kind.kind] {
			have[n] = true
		}
		for _, n := range kind.names {
			if !have[n] {
				return false
			}
		}
	}
	return true
}

// structureOf identifies the chains, rules, sets and maps of rs, leaving out the
// elements: a digest of the nft commands that create them, as the Syncer's nft
// renders them (a transaction that is never run). It costs O(chains + rules + sets
// + maps), which does not grow with the number of Services.
func (s *Syncer) structureOf(rs *ruleset.Ruleset) string {
	bare := *rs
	bare.Elements = nil
	tx := s.nft.NewTransaction()
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
