package ruleset

import (
	"reflect"
	"slices"

	"sigs.k8s.io/knftables"
)

// The equal* functions compare two versions of an object without reflection. They
// are exact when they report true: the versions are then reflect.DeepEqual. They
// may report false for some deeply equal versions (a field of a newer knftables
// they do not know, compared by address), which only costs the caller a slower
// comparison or an update it could have skipped.

// EqualObjects compares two versions of a chain, set, map or element without
// reflection: it is exact when it reports true, and may report false for deeply
// equal versions, as the functions below.
func EqualObjects(a, b any) bool {
	if a == b {
		return true
	}
	switch x := a.(type) {
	case *Chain:
		y, ok := b.(*Chain)
		return ok && equalChain(x, y)
	case *knftables.Set:
		y, ok := b.(*knftables.Set)
		return ok && equalSet(x, y)
	case *knftables.Map:
		y, ok := b.(*knftables.Map)
		return ok && equalMap(x, y)
	}
	return false
}

func equalChain(a, b *Chain) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil || len(a.Rules) != len(b.Rules) || (a.Rules == nil) != (b.Rules == nil) {
		return false
	}
	x, y := a.Chain, b.Chain
	if !ptrEqual(x.Type, y.Type) || !ptrEqual(x.Hook, y.Hook) || !ptrEqual(x.Priority, y.Priority) ||
		!ptrEqual(x.Policy, y.Policy) || !ptrEqual(x.Device, y.Device) || !ptrEqual(x.Comment, y.Comment) ||
		!ptrEqual(x.Handle, y.Handle) {
		return false
	}
	// The pointers are equal in value; every other field compares as is.
	x.Type, x.Hook, x.Priority, x.Policy, x.Device, x.Comment, x.Handle = y.Type, y.Hook, y.Priority, y.Policy, y.Device, y.Comment, y.Handle
	if x != y {
		return false
	}
	for i, r := range a.Rules {
		if !equalRule(r, b.Rules[i]) {
			return false
		}
	}
	return true
}

func equalRule(a, b *knftables.Rule) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	x, y := *a, *b
	if !ptrEqual(x.Comment, y.Comment) || !ptrEqual(x.Index, y.Index) || !ptrEqual(x.Handle, y.Handle) {
		return false
	}
	x.Comment, x.Index, x.Handle = y.Comment, y.Index, y.Handle
	return x == y
}

// knftables.Set and Map hold slices, which == cannot compare: their
// fields are listed one by one, and TestEqualKnowsEveryField checks the list.

func equalSet(a, b *knftables.Set) bool {
	if a == b {
		return true
	}
	return a != nil && b != nil &&
		a.Family == b.Family && a.Table == b.Table && a.Name == b.Name && a.Type == b.Type && a.TypeOf == b.TypeOf &&
		sliceEqual(a.Flags, b.Flags) && ptrEqual(a.Timeout, b.Timeout) && ptrEqual(a.GCInterval, b.GCInterval) &&
		ptrEqual(a.Size, b.Size) && ptrEqual(a.Policy, b.Policy) && ptrEqual(a.AutoMerge, b.AutoMerge) &&
		ptrEqual(a.Comment, b.Comment) && ptrEqual(a.Handle, b.Handle)
}

func equalMap(a, b *knftables.Map) bool {
	if a == b {
		return true
	}
	return a != nil && b != nil &&
		a.Family == b.Family && a.Table == b.Table && a.Name == b.Name && a.Type == b.Type && a.TypeOf == b.TypeOf &&
		sliceEqual(a.Flags, b.Flags) && ptrEqual(a.Timeout, b.Timeout) && ptrEqual(a.GCInterval, b.GCInterval) &&
		ptrEqual(a.Size, b.Size) && ptrEqual(a.Policy, b.Policy) && ptrEqual(a.Comment, b.Comment) &&
		ptrEqual(a.Handle, b.Handle)
}

func ptrEqual[T comparable](a, b *T) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}

// sliceEqual is slices.Equal, except that nil and empty differ, as they do for
// reflect.DeepEqual.
func sliceEqual[T comparable](a, b []T) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}

// SameChain reports whether two versions of a chain are deeply equal: definition
// and rules. It tries the cheap comparison first, which is exact when it says yes.
func SameChain(a, b *Chain) bool {
	if equalChain(a, b) {
		return true
	}
	return reflect.DeepEqual(a.Chain, b.Chain) && slices.EqualFunc(a.Rules, b.Rules, func(x, y *knftables.Rule) bool {
		return reflect.DeepEqual(x, y)
	})
}

// SameRule reports whether two rules are alike.
func SameRule(a, b *knftables.Rule) bool { return equalRule(a, b) }

// SameSet reports whether two versions of a set are deeply equal.
func SameSet(a, b *knftables.Set) bool { return equalSet(a, b) || reflect.DeepEqual(a, b) }

// SameMap reports whether two versions of a map are deeply equal.
func SameMap(a, b *knftables.Map) bool { return equalMap(a, b) || reflect.DeepEqual(a, b) }
