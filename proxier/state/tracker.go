package state

import (
	"cmp"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Tracker is the incremental store of the cluster as this node's proxier sees it.
// The daemon's informer handlers feed it Services, EndpointSlices, the Node and
// ServiceCIDRs, and the syncer reads a consistent ClusterState from it together with
// the Services that changed since its last sync. Cluster files are loaded through a
// Tracker as well, so that files and informers share one code path.
//
// A malformed object is never half-proxied: its previous valid version is removed,
// its error is returned and kept (see Errors), and everything else stays. A Tracker
// is safe for concurrent use.
type Tracker struct {
	nodeName string

	mu       sync.Mutex
	node     Node
	services map[ServiceName]*Service
	// slices holds the slices of each Service. The inner maps are copy-on-write, so
	// that a snapshot from State can share them with later versions.
	slices map[ServiceName]map[string]*EndpointSlice
	// sliceOwners records which Service each slice (by kind, namespace, name) is
	// filed under, so that a deleted or relabelled slice is found without
	// trusting the labels of the object passed in.
	sliceOwners map[objectKey]ServiceName
	// serviceCIDRs holds the ranges of each ServiceCIDR by name, and cidrUnion
	// their union as ClusterState.ServiceCIDRs has it.
	serviceCIDRs map[string][]netip.Prefix
	cidrUnion    []netip.Prefix
	changed      map[ServiceName]bool
	errs         map[objectKey]error
	// snapshot is the last ClusterState returned by State, nil after a change.
	snapshot *ClusterState
	// taken is the last ClusterState returned by TakeState, kept apart from
	// snapshot: once its taker releases it (released), the next TakeState brings
	// it up to date in place, which costs what changed rather than a copy of
	// every Service. dirty names the Services changed since taken was last made
	// current, and modified records any change since the last TakeState.
	taken    *ClusterState
	released bool
	dirty    map[ServiceName]bool
	modified bool
}

// objectKey identifies a Kubernetes object.
type objectKey struct {
	kind, namespace, name string
}

// NewTracker returns an empty Tracker for the node named nodeName; Nodes with other
// names are ignored.
func NewTracker(nodeName string) *Tracker {
	return &Tracker{
		nodeName:     nodeName,
		node:         Node{Name: nodeName},
		services:     map[ServiceName]*Service{},
		slices:       map[ServiceName]map[string]*EndpointSlice{},
		sliceOwners:  map[objectKey]ServiceName{},
		serviceCIDRs: map[string][]netip.Prefix{},
		changed:      map[ServiceName]bool{},
		errs:         map[objectKey]error{},
		dirty:        map[ServiceName]bool{},
	}
}

// UpdateService records an added or updated Service. A Service that is not proxied
// (see ConvertService) is removed. A malformed one is removed too, and its error is
// returned and kept until the Service becomes valid or is deleted.
func (t *Tracker) UpdateService(svc *v1.Service) error {
	if svc == nil {
		return nil
	}
	s, err := ConvertService(svc)
	name := ServiceName{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setError(objectKey{KindService, svc.Namespace, svc.Name}, err)
	if s == nil {
		t.removeService(name)
		return err
	}
	if old := t.services[name]; old != nil && reflect.DeepEqual(old, s) {
		return nil // an informer resync, or a change proxying does not see
	}
	t.services[name] = s
	t.touch(name)
	return nil
}

// DeleteService forgets a Service and its error. Its EndpointSlices are kept: they
// belong to the Service's name and may well outlive or precede the Service object.
func (t *Tracker) DeleteService(svc *v1.Service) {
	if svc == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.errs, objectKey{KindService, svc.Namespace, svc.Name})
	t.removeService(ServiceName{Namespace: svc.Namespace, Name: svc.Name})
}

// UpdateEndpointSlice records an added or updated EndpointSlice. A slice that is not
// proxied (see ConvertEndpointSlice) is removed. A malformed one is removed too, and
// its error is returned and kept until the slice becomes valid or is deleted.
func (t *Tracker) UpdateEndpointSlice(slice *discoveryv1.EndpointSlice) error {
	if slice == nil {
		return nil
	}
	s, err := ConvertEndpointSlice(slice)
	key := objectKey{KindEndpointSlice, slice.Namespace, slice.Name}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setError(key, err)
	if s == nil {
		t.removeSlice(key)
		return err
	}
	if owner, ok := t.sliceOwners[key]; ok && owner != s.Service {
		t.removeSlice(key) // relabelled to another Service
	}
	if old := t.slices[s.Service][s.Name]; old != nil && reflect.DeepEqual(old, s) {
		return nil
	}
	inner := maps.Clone(t.slices[s.Service])
	if inner == nil {
		inner = map[string]*EndpointSlice{}
	}
	inner[s.Name] = s
	t.slices[s.Service] = inner
	t.sliceOwners[key] = s.Service
	t.touch(s.Service)
	return nil
}

// DeleteEndpointSlice forgets an EndpointSlice and its error.
func (t *Tracker) DeleteEndpointSlice(slice *discoveryv1.EndpointSlice) {
	if slice == nil {
		return
	}
	key := objectKey{KindEndpointSlice, slice.Namespace, slice.Name}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.errs, key)
	t.removeSlice(key)
}

// UpdateNode records this node's Node; Nodes of other names are ignored. A change of
// zone or addresses marks every Service changed. A malformed Node leaves a Node with
// only its name, and its error is returned and kept until the Node becomes valid.
func (t *Tracker) UpdateNode(node *v1.Node) error {
	if node == nil || node.Name != t.nodeName {
		return nil
	}
	n, err := ConvertNode(node)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setError(objectKey{KindNode, "", node.Name}, err)
	t.setNode(n)
	return err
}

// DeleteNode forgets this node's zone and addresses, and the Node's error; Nodes of
// other names are ignored.
func (t *Tracker) DeleteNode(node *v1.Node) {
	if node == nil || node.Name != t.nodeName {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.errs, objectKey{KindNode, "", node.Name})
	t.setNode(Node{Name: t.nodeName})
}

// State returns the current ClusterState. It is a snapshot: later updates of the
// Tracker do not change it, so it may be read while updates go on. Callers share it
// (State returns the same snapshot until the next change) and must not mutate it,
// nor anything it points to.
func (t *Tracker) State() *ClusterState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state()
}

// state is State with t.mu held.
func (t *Tracker) state() *ClusterState {
	if t.snapshot == nil {
		t.snapshot = t.copyState()
	}
	return t.snapshot
}

// copyState returns a new ClusterState of the Tracker's current state. Copying
// the top-level maps is enough: Services, slices, their inner maps and the Node
// are replaced on change, never modified in place.
func (t *Tracker) copyState() *ClusterState {
	return &ClusterState{
		Node:         t.node,
		Services:     maps.Clone(t.services),
		Slices:       maps.Clone(t.slices),
		ServiceCIDRs: t.cidrUnion, // replaced on change, never modified
	}
}

// TakeChanged returns the Services whose Service or EndpointSlices changed since the
// previous call (every known Service after a change of the Node), and starts a new
// round. The Service of a returned name may be gone from the state: it was deleted.
func (t *Tracker) TakeChanged() map[ServiceName]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := t.changed
	t.changed = map[ServiceName]bool{}
	return changed
}

// Errors returns the latest error of each object that is currently malformed,
// ordered by kind, namespace and name. Each is an *ObjectError.
func (t *Tracker) Errors() []error {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(t.errs), func(a, b objectKey) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})
	errs := make([]error, 0, len(keys))
	for _, k := range keys {
		errs = append(errs, t.errs[k])
	}
	return errs
}

// setError records err as the latest error of key, or clears it when err is nil.
func (t *Tracker) setError(key objectKey, err error) {
	if err != nil {
		t.errs[key] = err
	} else {
		delete(t.errs, key)
	}
}

// removeService drops a Service from the state, if it is there.
func (t *Tracker) removeService(name ServiceName) {
	if _, ok := t.services[name]; !ok {
		return
	}
	delete(t.services, name)
	t.touch(name)
}

// removeSlice drops a slice from the state, if it is there.
func (t *Tracker) removeSlice(key objectKey) {
	owner, ok := t.sliceOwners[key]
	if !ok {
		return
	}
	delete(t.sliceOwners, key)
	inner := maps.Clone(t.slices[owner])
	delete(inner, key.name)
	if len(inner) == 0 {
		delete(t.slices, owner)
	} else {
		t.slices[owner] = inner
	}
	t.touch(owner)
}

// setNode replaces the Node, marking every Service changed if it differs.
func (t *Tracker) setNode(n Node) {
	if reflect.DeepEqual(t.node, n) {
		return
	}
	t.node = n
	t.invalidate()
	for name := range t.services {
		t.changed[name] = true
		t.dirty[name] = true
	}
	for name := range t.slices {
		t.changed[name] = true
		t.dirty[name] = true
	}
}

// touch marks a Service changed and drops the snapshot.
func (t *Tracker) touch(name ServiceName) {
	t.changed[name] = true
	t.dirty[name] = true
	t.invalidate()
}

// invalidate records a change of the state: State's snapshot is dropped and the
// next TakeState reports the state modified.
func (t *Tracker) invalidate() {
	t.snapshot = nil
	t.modified = true
}
