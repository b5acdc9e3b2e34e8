package changeset

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestOwnerList checks the chunked owner list against a sorted slice through
// random inserts, removals and pops, large enough to split chunks.
func TestOwnerList(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	owners := make([]*owner, 3000)
	for i := range owners {
		owners[i] = &owner{name: fmt.Sprintf("ns/svc-%05d", r.IntN(1_000_000))}
	}
	var l ownerList
	var model []string
	in := map[string]bool{}
	check := func(step int) {
		t.Helper()
		var got []string
		for _, c := range l.chunks {
			if len(c) == 0 || len(c) > ownerChunk {
				t.Fatalf("step %d: chunk of %d owners", step, len(c))
			}
			for _, o := range c {
				got = append(got, o.o.name)
			}
		}
		if !slices.Equal(got, model) || l.len() != len(model) {
			t.Fatalf("step %d: list %d owners, model %d", step, len(got), len(model))
		}
	}
	for step := range 20000 {
		o := owners[r.IntN(len(owners))]
		switch op := r.IntN(10); {
		case op < 6 && !in[o.name]:
			// Mostly in order, as a first build adds them.
			if step < 4000 {
				o = &owner{name: fmt.Sprintf("aa/%06d", step)}
			}
			l.insert(owned{o: o, val: o.name})
			in[o.name] = true
			i, _ := slices.BinarySearch(model, o.name)
			model = slices.Insert(model, i, o.name)
		case op < 9:
			l.remove(o.name)
			if in[o.name] {
				delete(in, o.name)
				i, _ := slices.BinarySearch(model, o.name)
				model = slices.Delete(model, i, i+1)
			}
		case len(model) > 0:
			if x := l.popFirst(); x.o.name != model[0] {
				t.Fatalf("step %d: popFirst = %s, want %s", step, x.o.name, model[0])
			}
			delete(in, model[0])
			model = model[1:]
		}
		if p := l.find(o.name); (p != nil) != in[o.name] || (p != nil && p.val != o.name) {
			t.Fatalf("step %d: find(%s) = %v", step, o.name, p)
		}
		if step%97 == 0 {
			check(step)
		}
	}
	check(-1)
}
