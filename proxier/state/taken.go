package state

// Taken is what TakeState hands out: the current state and how it differs from
// the state the previous TakeState returned.
type Taken struct {
	// State is the current state. It is the taker's until it calls Release, and
	// must not be read after: the Tracker then updates it in place.
	State *ClusterState
	// Changed names the Services that may differ between the previous state and
	// State (every known Service after a change of the Node). A named Service may
	// be gone from State: it was deleted.
	Changed map[ServiceName]bool
	// Prior holds what the previous state had of the Changed Services (their
	// Service and slices, absent where it had none), with its Node and
	// ServiceCIDRs; other Services may be missing from it. It is nil on the first
	// TakeState, and is the taker's until Release, as State is.
	Prior *ClusterState
	// Modified is false when nothing changed since the previous TakeState: State
	// equals the previous state (and is the same ClusterState).
	Modified bool
}

// TakeState returns the current state together with the Services changed since
// the previous TakeState and what they were then, at one instant, so that what is
// kept per Service can be updated by a diff of the changed Services alone (see
// Taken). It also starts a new round of TakeChanged.
//
// Once the taker is done with the state, Release lets the next TakeState update
// it in place, at the cost of what changed; a state that is not released stays as
// it is, and the next TakeState copies the whole state instead. Either way State
// is not affected: its snapshots are never updated in place.
func (t *Tracker) TakeState() Taken {
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.taken
	tk := Taken{Changed: t.changed, Modified: t.modified || prev == nil}
	t.changed = map[ServiceName]bool{}
	t.modified = false
	switch {
	case prev == nil:
		t.taken = t.copyState()
	case !tk.Modified:
		// Nothing changed since prev was made current, so no Service need be
		// in Prior.
		tk.Prior = &ClusterState{Node: prev.Node, ServiceCIDRs: prev.ServiceCIDRs,
			Services: map[ServiceName]*Service{}, Slices: map[ServiceName]map[string]*EndpointSlice{}}
	case t.released:
		tk.Prior = t.refresh(prev)
	default:
		// The taker may still read prev: it becomes Prior as a whole, and the
		// Tracker lets go of it.
		tk.Prior = prev
		t.taken = t.copyState()
	}
	if len(t.dirty) > 0 {
		t.dirty = map[ServiceName]bool{}
	}
	t.released = false
	tk.State = t.taken
	return tk
}

// refresh brings st, the released taken state, up to date in place and returns
// what it held of the dirty Services before, with its Node and ServiceCIDRs.
func (t *Tracker) refresh(st *ClusterState) *ClusterState {
	prior := &ClusterState{Node: st.Node, ServiceCIDRs: st.ServiceCIDRs,
		Services: make(map[ServiceName]*Service, len(t.dirty)),
		Slices:   make(map[ServiceName]map[string]*EndpointSlice, len(t.dirty))}
	for name := range t.dirty {
		if svc, ok := st.Services[name]; ok {
			prior.Services[name] = svc
		}
		if sl, ok := st.Slices[name]; ok {
			prior.Slices[name] = sl
		}
		if svc, ok := t.services[name]; ok {
			st.Services[name] = svc
		} else {
			delete(st.Services, name)
		}
		if sl, ok := t.slices[name]; ok {
			st.Slices[name] = sl
		} else {
			delete(st.Slices, name)
		}
	}
	st.Node = t.node
	st.ServiceCIDRs = t.cidrUnion
	return prior
}

// Release tells the Tracker that the taker of st, a State of TakeState, no longer
// reads it (nor its Taken's Prior), so that the next TakeState may update it in
// place. Releasing another ClusterState does nothing.
func (t *Tracker) Release(st *ClusterState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st != nil && st == t.taken {
		t.released = true
	}
}
