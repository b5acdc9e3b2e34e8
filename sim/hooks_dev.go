package sim

import "slices"

// passDev runs the ingress or egress hook when a chain hooks the packet's device
// there; it reports whether one of them ended the branch.
func (w *branchWalk) passDev(h Hook) bool {
	for _, e := range w.hooks[hookIndex[string(h)]] {
		if e.kind == eChain && e.chain.base.hooksDev(w.c.st, h) {
			return w.pass(h)
		}
	}
	return false
}

// noteDevices says, for a chain whose devices are not known (nft -j of nft 1.0.6
// does not list them), that it is taken to hook the packet's interface.
func (c *evalCtx) noteDevices(bc *chain) {
	if bc.base.devices == nil && (c.hook == HookIngress || c.hook == HookEgress) {
		c.step(Step{Kind: StepNote, Depth: 1, Rule: -1, Detail: "the devices of " + bc.table.id() + " chain " + bc.name +
			" are not listed: taken to include the packet's interface"})
	}
}

// hooksDev reports whether the base chain runs for the packet at hook h: always at
// the IP hooks; at ingress (egress) when its devices hold the input (output)
// interface.
func (b *baseChain) hooksDev(st *pktState, h Hook) bool {
	dev := ""
	switch h {
	case HookIngress:
		dev = st.iif
	case HookEgress:
		dev = st.oif
	default:
		return true
	}
	return dev != "" && (b.devices == nil || slices.Contains(b.devices, dev))
}
