package syncer

import (
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/changeset"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// txWriter is what an incremental sync queues its operations on: a
// knftables.Transaction, or a recorder that decides later where they go.
type txWriter interface {
	Add(knftables.Object)
	Delete(knftables.Object)
	Flush(knftables.Object)
}

var _ txWriter = (*knftables.Transaction)(nil)

// verb is the kind of a recorded operation.
type verb uint8

const (
	addVerb verb = iota
	deleteVerb
	flushVerb
)

// recorded is one operation of a recorder.
type recorded struct {
	verb verb
	obj  knftables.Object
}

// recorder records the operations of an incremental sync in order, so that they
// can go as one netlink batch when they touch elements only (elementOps), or be
// replayed on an nft transaction.
type recorder struct {
	ops []recorded
}

func (r *recorder) Add(o knftables.Object)    { r.ops = append(r.ops, recorded{addVerb, o}) }
func (r *recorder) Delete(o knftables.Object) { r.ops = append(r.ops, recorded{deleteVerb, o}) }
func (r *recorder) Flush(o knftables.Object)  { r.ops = append(r.ops, recorded{flushVerb, o}) }

// replay queues the recorded operations on tx, in order.
func (r *recorder) replay(tx *knftables.Transaction) {
	for _, op := range r.ops {
		switch op.verb {
		case addVerb:
			tx.Add(op.obj)
		case deleteVerb:
			tx.Delete(op.obj)
		case flushVerb:
			tx.Flush(op.obj)
		}
	}
}

// elementOps returns the recorded operations as netlink element operations and
// the number of elements they delete and add, when every one of them adds or
// deletes an element, or flushes a set or map, of a set or map of desired (or one
// delta removes) whose elements the loader encodes; and when, within each set or
// map, a flush comes first and no deletion follows an addition (the batch writes
// a container's flush, deletions and additions in that order). It returns false
// otherwise.
func (r *recorder) elementOps(desired *ruleset.Ruleset, delta *changeset.Delta) ([]elementOps, int, bool) {
	type pending struct {
		op       elementOps
		del, add []*knftables.Element
	}
	byName := map[string]*pending{}
	var order []string
	for _, rec := range r.ops {
		var name string
		var elem *knftables.Element
		switch o := rec.obj.(type) {
		case *knftables.Element:
			name, elem = ruleset.Container(o), o
		case *knftables.Set:
			name = o.Name
		case *knftables.Map:
			name = o.Name
		default:
			return nil, 0, false
		}
		if (elem == nil) != (rec.verb == flushVerb) {
			return nil, 0, false
		}
		p := byName[name]
		if p == nil {
			c, err := containerOf(definition(name, desired, delta))
			if err != nil {
				return nil, 0, false
			}
			p = &pending{op: elementOps{c: c}}
			byName[name] = p
			order = append(order, name)
		}
		switch rec.verb {
		case flushVerb:
			if p.op.flush || len(p.del)+len(p.add) > 0 {
				return nil, 0, false
			}
			p.op.flush = true
		case deleteVerb:
			if len(p.add) > 0 {
				return nil, 0, false
			}
			p.del = append(p.del, elem)
		case addVerb:
			p.add = append(p.add, elem)
		}
	}
	ops := make([]elementOps, 0, len(order))
	n := 0
	for _, name := range order {
		p := byName[name]
		p.op.del, p.op.add, p.op.n = slices.Values(p.del), slices.Values(p.add), len(p.del)+len(p.add)
		ops = append(ops, p.op)
		n += p.op.n
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
