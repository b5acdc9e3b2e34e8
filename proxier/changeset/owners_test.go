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
	var tab []*owner
	newOwner := func(name string) *owner {
		o := &owner{name: name, id: int32(len(tab))}
		tab = append(tab, o)
		return o
	}
	owners := make([]*owner, 3000)
	names := map[string]bool{}
	for i := range owners {
		name := fmt.Sprintf("ns/svc-%06d", r.IntN(1_000_000))
		for names[name] {
			name = fmt.Sprintf("ns/svc-%06d", r.IntN(1_000_000))
		}
		names[name] = true
		owners[i] = newOwner(name)
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
				got = append(got, tab[o.id].name)
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
				o = newOwner(fmt.Sprintf("aa/%06d", step))
			}
			l.insert(tab, o, o.name)
			in[o.name] = true
			i, _ := slices.BinarySearch(model, o.name)
			model = slices.Insert(model, i, o.name)
		case op < 9:
			l.remove(tab, o)
			if in[o.name] {
				delete(in, o.name)
				i, _ := slices.BinarySearch(model, o.name)
				model = slices.Delete(model, i, i+1)
			}
		case len(model) > 0:
			if x, v := l.popFirst(tab); x.name != model[0] || v != x.name {
				t.Fatalf("step %d: popFirst = %s (%v), want %s", step, x.name, v, model[0])
			}
			delete(in, model[0])
			model = model[1:]
		}
		ci, i, found := l.locate(tab, o)
		if found != in[o.name] || (found && l.vers[l.chunks[ci][i].ver].val != o.name) {
			t.Fatalf("step %d: locate(%s) = %v", step, o.name, found)
		}
		if step%97 == 0 {
			check(step)
		}
	}
	check(-1)
}
