package syncer

import (
	"slices"

	"sigs.k8s.io/knftables"
)

func eqPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameChainDef(a, b *knftables.Chain) bool {
	return eqPtr(a.Type, b.Type) && eqPtr(a.Hook, b.Hook) && eqPtr(a.Priority, b.Priority) &&
		eqPtr(a.Policy, b.Policy) && eqPtr(a.Device, b.Device) && eqPtr(a.Comment, b.Comment)
}

func sameSet(a, b *knftables.Set) bool {
	return a.Type == b.Type && a.TypeOf == b.TypeOf && slices.Equal(a.Flags, b.Flags) &&
		eqPtr(a.Timeout, b.Timeout) && eqPtr(a.GCInterval, b.GCInterval) && eqPtr(a.Size, b.Size) &&
		eqPtr(a.Policy, b.Policy) && eqPtr(a.AutoMerge, b.AutoMerge) && eqPtr(a.Comment, b.Comment)
}

func sameMap(a, b *knftables.Map) bool {
	return a.Type == b.Type && a.TypeOf == b.TypeOf && slices.Equal(a.Flags, b.Flags) &&
		eqPtr(a.Timeout, b.Timeout) && eqPtr(a.GCInterval, b.GCInterval) && eqPtr(a.Size, b.Size) &&
		eqPtr(a.Policy, b.Policy) && eqPtr(a.Comment, b.Comment)
}
