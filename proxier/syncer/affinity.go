package syncer

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// affinityPlan is the session-affinity record moves of one sync and the records
// they move, listed before the sync's transaction, which may delete a set that
// records move out of (its index is no longer in use).
type affinityPlan struct {
	moves   []changeset.AffinityMove
	records map[string][]*knftables.Element
}

// listAffinity lists the kernel's affinity sets that moves take records out of. It
// costs nothing when moves is empty, which it is unless an affinity Service's
// endpoints changed.
func (s *Syncer) listAffinity(ctx context.Context, moves []changeset.AffinityMove) (*affinityPlan, error) {
	p := &affinityPlan{moves: moves, records: map[string][]*knftables.Element{}}
	for _, m := range moves {
		if _, ok := p.records[m.From]; ok {
			continue
		}
		es, err := s.nft.ListElements(ctx, "set", m.From)
		if err != nil && !knftables.IsNotFound(err) {
			return nil, fmt.Errorf("listing affinity set %s: %w", m.From, err)
		}
		p.records[m.From] = es
	}
	return p, nil
}

// moveAffinity carries out plan after the sync's transaction: in one transaction it
// deletes the listed records of the moved frontends (from the sets that are still
// there) and adds them to the set of their endpoint's new index, with the Service's
// timeout. A client recorded between the listing and the sync's transaction keeps
// its record where it is.
func (s *Syncer) moveAffinity(ctx context.Context, desired *ruleset.Ruleset, plan *affinityPlan) error {
	if plan == nil || len(plan.moves) == 0 {
		return nil
	}
	nodeIPs := desired.NodePortIPs()
	tx := s.nft.NewTransaction()
	var adds []*knftables.Element
	for set, records := range plan.records {
		_, kept := desired.Sets[set]
		for _, r := range records {
			for i := range plan.moves {
				m := &plan.moves[i]
				if m.From != set || !m.Matches(r.Key, nodeIPs) {
					continue
				}
				if kept {
					// Adding first makes the deletion succeed even if the record
					// expired in between.
					tx.Add(&knftables.Element{Set: set, Key: r.Key})
					tx.Delete(&knftables.Element{Set: set, Key: r.Key})
				}
				if _, ok := desired.Sets[m.To]; ok {
					adds = append(adds, &knftables.Element{Set: m.To, Key: withTimeout(r.Key, m.Timeout)})
				}
				break
			}
		}
	}
	for _, e := range adds {
		tx.Add(e)
	}
	if tx.NumOperations() == 0 {
		return nil
	}
	if err := s.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("moving the affinity records of %d frontend endpoints: %w", len(plan.moves), err)
	}
	s.commits++
	return nil
}

// withTimeout returns key with the element timeout secs attached, as nft reads it
// ("… . 80 timeout 90s"): knftables.Element has no field for a per-element timeout,
// and a moved record must keep its Service's timeout, not the set's default.
func withTimeout(key []string, secs string) []string {
	if secs == "" || len(key) == 0 {
		return key
	}
	out := append([]string(nil), key...)
	out[len(out)-1] += " timeout " + secs + "s"
	return out
}

// kernelAffinityMoves returns the moves that fit the kernel's affinity records to
// desired when the Syncer has not applied anything yet (a restarted proxier): the
// old side is read from the affinity backends maps in the kernel, existing names
// the table's maps.
func (s *Syncer) kernelAffinityMoves(ctx context.Context, desired *ruleset.Ruleset, existing []string) ([]changeset.AffinityMove, error) {
	old := ruleset.New(desired.Family, desired.Table)
	want := ruleset.New(desired.Family, desired.Table)
	for _, name := range existing {
		if !strings.HasPrefix(name, ruleset.AffinityMapPrefix) {
			continue
		}
		elems, err := s.nft.ListElements(ctx, "map", name)
		if err != nil {
			return nil, fmt.Errorf("listing map %s: %w", name, err)
		}
		for _, e := range elems {
			e.Map, e.Set = name, ""
			old.AddKnftElement(e)
		}
		for k, e := range desired.Elements[name] {
			want.AddElement(name, k, e)
		}
	}
	return changeset.AffinityMoves(desired, changeset.Diff(old, want)), nil
}
