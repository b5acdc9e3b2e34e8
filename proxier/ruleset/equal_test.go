package ruleset

import (
	"os"
	"reflect"
	"testing"

	"sigs.k8s.io/knftables"
)

// TestEqualKnowsEveryField guards equalSet and equalMap, which list
// the fields of the knftables types: a new field must be added to them.
func TestEqualKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		v    any
		want int
	}{{knftables.Set{}, 13}, {knftables.Map{}, 12}} {
		if n := reflect.TypeOf(c.v).NumField(); n != c.want {
			t.Errorf("%T has %d fields, equal.go compares %d", c.v, n, c.want)
		}
	}
}

// TestEqualMatchesDeepEqual checks that EqualObjects and the equal* functions never call equal two
// versions reflect.DeepEqual tells apart.
func TestEqualMatchesDeepEqual(t *testing.T) {
	st, cfg := everything(t)
	var objs []any
	for _, f := range dual {
		rs := Build(st, cfg, f)
		for _, c := range rs.Chains {
			objs = append(objs, c)
		}
		for _, s := range rs.Sets {
			objs = append(objs, s)
		}
		for _, m := range rs.Maps {
			objs = append(objs, m)
		}
	}
	// Variants that differ in one field each.
	s := "x"
	objs = append(objs,
		&Chain{Chain: knftables.Chain{Name: "c"}}, &Chain{Chain: knftables.Chain{Name: "c"}, Rules: []*knftables.Rule{}},
		&Chain{Chain: knftables.Chain{Name: "c", Comment: &s}},
		&Chain{Chain: knftables.Chain{Name: "c"}, Rules: []*knftables.Rule{{Chain: "c", Rule: "drop"}}},
		&Chain{Chain: knftables.Chain{Name: "c"}, Rules: []*knftables.Rule{{Chain: "c", Rule: "drop", Comment: &s}}},
		&knftables.Set{Name: "s"}, &knftables.Set{Name: "s", Flags: []knftables.SetFlag{}},
		&knftables.Map{Name: "s"}, &knftables.Map{Name: "s", Comment: &s},
	)
	for i, a := range objs {
		for j, b := range objs {
			if i%7 != 0 && j != i && j != i+1 && j < len(objs)-20 && i < len(objs)-20 {
				continue // a sample of the pairs is enough
			}
			if got, want := EqualObjects(a, b), reflect.DeepEqual(a, b); got && !want {
				t.Fatalf("EqualObjects(%+v, %+v) = true, but they differ", a, b)
			}
		}
	}
}

// TestMain runs the tests with parallel first builds from a few Services on, so
// that the small clusters of the tests take the parallel path too.
func TestMain(m *testing.M) {
	ParallelMin = 2
	os.Exit(m.Run())
}
