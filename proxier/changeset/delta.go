package changeset

import (
	"sort"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// Change is an object before and after an Update; Old is nil for a new object and
// New nil for a removed one.
type Change[T any] struct {
	Old, New T
}

// Delta is what an Update changed in the ruleset.
type Delta struct {
	Chains   map[string]Change[*ruleset.Chain]
	Sets     map[string]Change[*knftables.Set]
	Maps     map[string]Change[*knftables.Map]
	Elements map[string]map[string]Change[*ruleset.Elem]
}

// NewDelta returns an empty Delta.
func NewDelta() *Delta {
	return &Delta{
		Chains:   map[string]Change[*ruleset.Chain]{},
		Sets:     map[string]Change[*knftables.Set]{},
		Maps:     map[string]Change[*knftables.Map]{},
		Elements: map[string]map[string]Change[*ruleset.Elem]{},
	}
}

// Len returns the number of objects that changed.
func (d *Delta) Len() int {
	n := len(d.Chains) + len(d.Sets) + len(d.Maps)
	for _, es := range d.Elements {
		n += len(es)
	}
	return n
}

// Diff returns the Delta that turns old into desired (old may be nil, for an empty
// table). It costs O(size of both).
func Diff(old, desired *ruleset.Ruleset) *Delta {
	if old == nil {
		old = ruleset.New(desired.Family, desired.Table)
	}
	d := NewDelta()
	diffMaps(old.Chains, desired.Chains, d.Chains, ruleset.SameChain)
	diffMaps(old.Sets, desired.Sets, d.Sets, ruleset.SameSet)
	diffMaps(old.Maps, desired.Maps, d.Maps, ruleset.SameMap)
	for _, c := range unionKeys(old.Elements, desired.Elements) {
		m := map[string]Change[*ruleset.Elem]{}
		diffElems(old.Elements[c], desired.Elements[c], m)
		if len(m) > 0 {
			d.Elements[c] = m
		}
	}
	return d
}

func diffMaps[T comparable](old, desired map[string]T, out map[string]Change[T], same func(a, b T) bool) {
	var zero T
	for k, o := range old {
		if n, ok := desired[k]; !ok {
			out[k] = Change[T]{Old: o}
		} else if !same(o, n) {
			out[k] = Change[T]{Old: o, New: n}
		}
	}
	for k, n := range desired {
		if _, ok := old[k]; !ok {
			out[k] = Change[T]{Old: zero, New: n}
		}
	}
}

func diffElems(old, desired map[string]ruleset.Elem, out map[string]Change[*ruleset.Elem]) {
	for k, o := range old {
		if n, ok := desired[k]; !ok {
			out[k] = Change[*ruleset.Elem]{Old: &o}
		} else if o != n {
			out[k] = Change[*ruleset.Elem]{Old: &o, New: &n}
		}
	}
	for k, n := range desired {
		if _, ok := old[k]; !ok {
			out[k] = Change[*ruleset.Elem]{New: &n}
		}
	}
}

func unionKeys[V any](a, b map[string]V) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// wholeDelta returns the Delta that creates every object of r.
func wholeDelta(r *ruleset.Ruleset) *Delta {
	d := &Delta{
		Chains:   make(map[string]Change[*ruleset.Chain], len(r.Chains)),
		Sets:     make(map[string]Change[*knftables.Set], len(r.Sets)),
		Maps:     make(map[string]Change[*knftables.Map], len(r.Maps)),
		Elements: make(map[string]map[string]Change[*ruleset.Elem], len(r.Elements)),
	}
	for n, c := range r.Chains {
		d.Chains[n] = Change[*ruleset.Chain]{New: c}
	}
	for n, s := range r.Sets {
		d.Sets[n] = Change[*knftables.Set]{New: s}
	}
	for n, m := range r.Maps {
		d.Maps[n] = Change[*knftables.Map]{New: m}
	}
	for c, es := range r.Elements {
		m := make(map[string]Change[*ruleset.Elem], len(es))
		vals := make([]ruleset.Elem, 0, len(es))
		for k, e := range es {
			vals = append(vals, e)
			m[k] = Change[*ruleset.Elem]{New: &vals[len(vals)-1]}
		}
		d.Elements[c] = m
	}
	return d
}

func asPtr[T any](v any) *T {
	if v == nil {
		return nil
	}
	return v.(*T)
}
