package state

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// named returns a copy of testService renamed to default/name.
func named(name string, mods ...func(*v1.Service)) *v1.Service {
	return testService(append([]func(*v1.Service){func(s *v1.Service) { s.Name = name }}, mods...)...)
}

// sliceOf returns a copy of testSlice named name, of Service svc.
func sliceOf(name, svc string, mods ...func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	return testSlice(append([]func(*discoveryv1.EndpointSlice){func(s *discoveryv1.EndpointSlice) {
		s.Name = name
		s.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}}, mods...)...)
}

func sn(name string) ServiceName { return ServiceName{Namespace: "default", Name: name} }

// changedNames returns the names TakeChanged reports, sorted.
func changedNames(t *Tracker) []string {
	var out []string
	for n := range t.TakeChanged() {
		out = append(out, n.String())
	}
	slices.Sort(out)
	return out
}

// serviceNames returns the Services of st, sorted.
func serviceNames(st *ClusterState) []string {
	var out []string
	for n := range st.Services {
		out = append(out, n.String())
	}
	slices.Sort(out)
	return out
}

// sliceNames returns the slices of Service name in st, sorted.
func sliceNames(st *ClusterState, name string) []string {
	return slices.Sorted(maps.Keys(st.Slices[sn(name)]))
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestTrackerTakeChanged(t *testing.T) {
	tr := NewTracker("node-a")
	steps := []struct {
		name   string
		do     func()
		want   []string
		verify func(st *ClusterState) error
	}{
		{"nothing yet", func() {}, nil, nil},
		{"add a Service", func() { mustNil(t, tr.UpdateService(named("web"))) }, []string{"default/web"}, nil},
		{"resync of the same Service", func() { mustNil(t, tr.UpdateService(named("web"))) }, nil, nil},
		{
			"change unseen by proxying",
			func() {
				mustNil(t, tr.UpdateService(named("web", func(s *v1.Service) { s.Annotations = map[string]string{"a": "b"} })))
			},
			nil, nil,
		},
		{
			"change of a port",
			func() { mustNil(t, tr.UpdateService(named("web", func(s *v1.Service) { s.Spec.Ports[0].Port = 81 }))) },
			[]string{"default/web"},
			func(st *ClusterState) error {
				if p := st.Services[sn("web")].Ports[0].Port; p != 81 {
					return fmt.Errorf("port %d, want 81", p)
				}
				return nil
			},
		},
		{"add a slice", func() { mustNil(t, tr.UpdateEndpointSlice(sliceOf("web-1", "web"))) }, []string{"default/web"}, nil},
		{"resync of the same slice", func() { mustNil(t, tr.UpdateEndpointSlice(sliceOf("web-1", "web"))) }, nil, nil},
		{
			"a slice before its Service",
			func() { mustNil(t, tr.UpdateEndpointSlice(sliceOf("api-1", "api"))) },
			[]string{"default/api"},
			func(st *ClusterState) error {
				if st.Services[sn("api")] != nil || len(st.Slices[sn("api")]) != 1 {
					return errors.New("want the slice of api kept without the Service")
				}
				return nil
			},
		},
		{
			"two changes, one round",
			func() {
				mustNil(t, tr.UpdateService(named("api")))
				mustNil(t, tr.UpdateEndpointSlice(sliceOf("web-2", "web")))
			},
			[]string{"default/api", "default/web"}, nil,
		},
		{
			"a slice relabelled to another Service",
			func() { mustNil(t, tr.UpdateEndpointSlice(sliceOf("web-2", "api"))) },
			[]string{"default/api", "default/web"},
			func(st *ClusterState) error {
				if got := sliceNames(st, "web"); !slices.Equal(got, []string{"web-1"}) {
					return fmt.Errorf("web has slices %v, want [web-1]", got)
				}
				if got := sliceNames(st, "api"); !slices.Equal(got, []string{"api-1", "web-2"}) {
					return fmt.Errorf("api has slices %v, want [api-1 web-2]", got)
				}
				return nil
			},
		},
		{"delete a slice", func() { tr.DeleteEndpointSlice(sliceOf("web-2", "whatever")) }, []string{"default/api"}, nil},
		{"delete an unknown slice", func() { tr.DeleteEndpointSlice(sliceOf("nope", "web")) }, nil, nil},
		{"another node", func() { mustNil(t, tr.UpdateNode(testNode(func(n *v1.Node) { n.Name = "node-b" }))) }, nil,
			func(st *ClusterState) error {
				if st.Node.Zone != "" || st.Node.Name != "node-a" {
					return fmt.Errorf("node %+v, want node-a untouched", st.Node)
				}
				return nil
			},
		},
		{
			"this node marks every Service",
			func() { mustNil(t, tr.UpdateNode(testNode())) },
			[]string{"default/api", "default/web"},
			func(st *ClusterState) error {
				if st.Node.Zone != "z1" || len(st.Node.Addresses) != 3 {
					return fmt.Errorf("node %+v, want zone z1 and 3 addresses", st.Node)
				}
				return nil
			},
		},
		{"resync of the Node", func() { mustNil(t, tr.UpdateNode(testNode())) }, nil, nil},
		{
			"the Node's pod CIDR allocated marks every Service (the NodeCIDR detector reads it)",
			func() {
				mustNil(t, tr.UpdateNode(testNode(func(n *v1.Node) { n.Spec.PodCIDRs = []string{"10.1.0.0/24"} })))
			},
			[]string{"default/api", "default/web"},
			func(st *ClusterState) error {
				if len(st.Node.PodCIDRs) != 1 || st.Node.PodCIDRs[0].String() != "10.1.0.0/24" {
					return fmt.Errorf("node pod CIDRs %v, want [10.1.0.0/24]", st.Node.PodCIDRs)
				}
				return nil
			},
		},
		{"the Node as it was", func() { mustNil(t, tr.UpdateNode(testNode())) }, []string{"default/api", "default/web"}, nil},
		{
			"delete a Service, keeping its slices",
			func() { tr.DeleteService(named("web")) },
			[]string{"default/web"},
			func(st *ClusterState) error {
				if st.Services[sn("web")] != nil || len(st.Slices[sn("web")]) != 1 {
					return errors.New("want web gone and its slice kept")
				}
				return nil
			},
		},
		{"the Service back", func() { mustNil(t, tr.UpdateService(named("web"))) }, []string{"default/web"}, nil},
		{
			"a Service turned headless",
			func() {
				mustNil(t, tr.UpdateService(named("web", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} })))
			},
			[]string{"default/web"},
			func(st *ClusterState) error {
				if st.Services[sn("web")] != nil {
					return errors.New("headless web still proxied")
				}
				return nil
			},
		},
		{"the Node deleted", func() { tr.DeleteNode(testNode()) }, []string{"default/api", "default/web"},
			func(st *ClusterState) error {
				if diff := cmp.Diff(Node{Name: "node-a"}, st.Node, cmpNet); diff != "" {
					return fmt.Errorf("node (-want +got):\n%s", diff)
				}
				return nil
			},
		},
	}
	for _, s := range steps {
		s.do()
		if diff := cmp.Diff(s.want, changedNames(tr)); diff != "" {
			t.Errorf("after %q: changed (-want +got):\n%s", s.name, diff)
		}
		if s.verify != nil {
			if err := s.verify(tr.State()); err != nil {
				t.Errorf("after %q: %v", s.name, err)
			}
		}
	}
	if errs := tr.Errors(); len(errs) != 0 {
		t.Errorf("Errors() = %v, want none", errs)
	}
}

func TestTrackerMalformedObjects(t *testing.T) {
	tr := NewTracker("node-a")
	mustNil(t, tr.UpdateNode(testNode()))
	for _, name := range []string{"web", "api", "db"} {
		mustNil(t, tr.UpdateService(named(name)))
		mustNil(t, tr.UpdateEndpointSlice(sliceOf(name+"-1", name)))
	}
	tr.TakeChanged()

	// A Service gone bad is no longer proxied; its slices and the others stay.
	err := tr.UpdateService(named("web", func(s *v1.Service) { s.Spec.Ports[0].Protocol = "TCPX" }))
	checkObjectError(t, err, KindService, "default", "web", "spec.ports[0].protocol")
	st := tr.State()
	if diff := cmp.Diff([]string{"default/api", "default/db"}, serviceNames(st)); diff != "" {
		t.Errorf("Services after a bad update (-want +got):\n%s", diff)
	}
	if len(st.Slices[sn("web")]) != 1 {
		t.Errorf("the slice of the broken Service is gone")
	}
	if diff := cmp.Diff([]string{"default/web"}, changedNames(tr)); diff != "" {
		t.Errorf("changed (-want +got):\n%s", diff)
	}

	// A slice gone bad is removed; its Service stays.
	err = tr.UpdateEndpointSlice(sliceOf("api-1", "api", func(s *discoveryv1.EndpointSlice) {
		s.Endpoints[0].Addresses = []string{"10.1.0.999"}
	}))
	checkObjectError(t, err, KindEndpointSlice, "default", "api-1", "endpoints[0].addresses[0]")
	st = tr.State()
	if st.Services[sn("api")] == nil || len(st.Slices[sn("api")]) != 0 {
		t.Errorf("want api proxied without its broken slice; slices %v", sliceNames(st, "api"))
	}

	// A slice that loses its label is removed from the Service it was filed under.
	err = tr.UpdateEndpointSlice(sliceOf("db-1", "db", func(s *discoveryv1.EndpointSlice) { s.Labels = nil }))
	checkObjectError(t, err, KindEndpointSlice, "default", "db-1", "metadata.labels[kubernetes.io/service-name]")
	if got := sliceNames(tr.State(), "db"); len(got) != 0 {
		t.Errorf("db still has slices %v", got)
	}
	if diff := cmp.Diff([]string{"default/api", "default/db"}, changedNames(tr)); diff != "" {
		t.Errorf("changed (-want +got):\n%s", diff)
	}

	// A bad Node keeps only its name.
	err = tr.UpdateNode(testNode(func(n *v1.Node) { n.Status.Addresses[1].Address = "192.168.0" }))
	checkObjectError(t, err, KindNode, "", "node-a", "status.addresses[1].address")
	if diff := cmp.Diff(Node{Name: "node-a"}, tr.State().Node, cmpNet); diff != "" {
		t.Errorf("node after a bad update (-want +got):\n%s", diff)
	}

	var got []string
	for _, err := range tr.Errors() {
		var oe *ObjectError
		if !errors.As(err, &oe) {
			t.Fatalf("Errors() holds %T, want *ObjectError", err)
		}
		got = append(got, oe.Object())
	}
	want := []string{"endpointslice default/api-1", "endpointslice default/db-1", "node node-a", "service default/web"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Errors() (-want +got):\n%s", diff)
	}

	// The latest error of an object replaces the earlier one.
	err = tr.UpdateService(named("web", func(s *v1.Service) { s.Spec.Ports[0].Port = 0 }))
	checkObjectError(t, err, KindService, "default", "web", "spec.ports[0].port")
	if errs := tr.Errors(); len(errs) != 4 || !errors.Is(errs[3], err) {
		t.Errorf("Errors() = %v, want the latest error of web last", errs)
	}

	// Errors are cleared by a valid version or a deletion.
	mustNil(t, tr.UpdateService(named("web")))
	mustNil(t, tr.UpdateNode(testNode()))
	tr.DeleteEndpointSlice(sliceOf("api-1", "api"))
	mustNil(t, tr.UpdateEndpointSlice(sliceOf("db-1", "db")))
	if errs := tr.Errors(); len(errs) != 0 {
		t.Errorf("Errors() = %v, want none", errs)
	}
	st = tr.State()
	if diff := cmp.Diff([]string{"default/api", "default/db", "default/web"}, serviceNames(st)); diff != "" {
		t.Errorf("Services after repairs (-want +got):\n%s", diff)
	}
	if got := sliceNames(st, "db"); !slices.Equal(got, []string{"db-1"}) {
		t.Errorf("db slices %v, want [db-1]", got)
	}
	if st.Node.Zone != "z1" {
		t.Errorf("node %+v not repaired", st.Node)
	}

	// A bad Service that is deleted takes its error with it.
	_ = tr.UpdateService(named("db", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"x"} }))
	tr.DeleteService(named("db"))
	if errs := tr.Errors(); len(errs) != 0 {
		t.Errorf("Errors() after deleting the bad Service = %v, want none", errs)
	}
}

func TestTrackerStateIsASnapshot(t *testing.T) {
	tr := NewTracker("node-a")
	mustNil(t, tr.UpdateService(named("web")))
	mustNil(t, tr.UpdateEndpointSlice(sliceOf("web-1", "web")))
	before := tr.State()
	if tr.State() != before {
		t.Errorf("State() without a change in between made a new snapshot")
	}

	mustNil(t, tr.UpdateEndpointSlice(sliceOf("web-2", "web")))
	mustNil(t, tr.UpdateService(named("web", func(s *v1.Service) { s.Spec.Ports[0].Port = 81 })))
	mustNil(t, tr.UpdateService(named("api")))
	mustNil(t, tr.UpdateNode(testNode()))
	tr.DeleteEndpointSlice(sliceOf("web-1", "web"))

	if got := serviceNames(before); !slices.Equal(got, []string{"default/web"}) {
		t.Errorf("old snapshot's Services changed to %v", got)
	}
	if got := sliceNames(before, "web"); !slices.Equal(got, []string{"web-1"}) {
		t.Errorf("old snapshot's slices changed to %v", got)
	}
	if p := before.Services[sn("web")].Ports[0].Port; p != 80 {
		t.Errorf("old snapshot's Service changed: port %d", p)
	}
	if before.Node.Zone != "" {
		t.Errorf("old snapshot's Node changed: %+v", before.Node)
	}
	after := tr.State()
	if got := sliceNames(after, "web"); !slices.Equal(got, []string{"web-2"}) {
		t.Errorf("new snapshot's slices %v, want [web-2]", got)
	}
}

// TestTrackerConcurrentReads is for the race detector: snapshots are read while
// updates go on.
func TestTrackerConcurrentReads(t *testing.T) {
	tr := NewTracker("node-a")
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			st := tr.State()
			for name, svc := range st.Services {
				_ = st.Endpoints(svc, svc.Ports[0])
				_ = st.Slices[name]
			}
			_ = tr.Errors()
		}
	}()
	for i := range 200 {
		name := fmt.Sprintf("svc-%d", i%20)
		mustNil(t, tr.UpdateService(named(name, func(s *v1.Service) { s.Spec.Ports[0].Port = int32(80 + i) })))
		mustNil(t, tr.UpdateEndpointSlice(sliceOf(fmt.Sprintf("%s-%d", name, i%3), name)))
		if i%7 == 0 {
			tr.DeleteEndpointSlice(sliceOf(fmt.Sprintf("%s-%d", name, i%3), name))
			tr.TakeChanged()
		}
	}
	close(done)
	wg.Wait()
	if n := len(tr.State().Services); n != 20 {
		t.Errorf("%d Services, want 20", n)
	}
}

// TestTrackerServiceProxyName checks that a Service labelled for another proxy leaves
// the state, whatever the label's value, and comes back when the label goes, while
// its EndpointSlices stay filed under its name.
func TestTrackerServiceProxyName(t *testing.T) {
	tr := NewTracker("node-a")
	mustNil(t, tr.UpdateService(named("web")))
	mustNil(t, tr.UpdateEndpointSlice(sliceOf("web-abc", "web")))
	tr.TakeChanged()
	for _, value := range []string{"other-proxy", ""} {
		mustNil(t, tr.UpdateService(named("web", func(s *v1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: value}
		})))
		if got := changedNames(tr); !slices.Equal(got, []string{"default/web"}) {
			t.Errorf("label %q: changed %v, want [default/web]", value, got)
		}
		st := tr.State()
		if got := serviceNames(st); len(got) != 0 {
			t.Errorf("label %q: Services %v, want none", value, got)
		}
		if got := sliceNames(st, "web"); !slices.Equal(got, []string{"web-abc"}) {
			t.Errorf("label %q: slices %v, want [web-abc]", value, got)
		}
		mustNil(t, tr.UpdateService(named("web")))
		if got := serviceNames(tr.State()); !slices.Equal(got, []string{"default/web"}) {
			t.Errorf("label %q removed: Services %v, want [default/web]", value, got)
		}
		tr.TakeChanged()
	}
}

// TestTrackerTakeStateNamesEveryDifference takes states while another goroutine
// changes Services and slices, and checks that each take names every Service that
// differs from the previous take's state, as a diff of the two relies on.
func TestTrackerTakeStateNamesEveryDifference(t *testing.T) {
	tr := NewTracker("node-a")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			name := fmt.Sprintf("svc-%d", i%20)
			err := errors.Join(tr.UpdateService(named(name, func(s *v1.Service) { s.Spec.Ports[0].Port = int32(80 + i) })),
				tr.UpdateEndpointSlice(sliceOf(fmt.Sprintf("%s-%d", name, i%3), name)))
			if err != nil {
				t.Error(err) // not Fatal: this is not the test's goroutine
				return
			}
		}
	}()
	prev := &ClusterState{}
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true // one more take after the last change
		default:
		}
		tk := tr.TakeState() // not released: prev stays as it was
		cur, changed := tk.State, tk.Changed
		for name, svc := range cur.Services {
			if prev.Services[name] != svc && !changed[name] {
				t.Fatalf("Service %s changed between two takes, not named changed", name)
			}
		}
		for name, sl := range cur.Slices {
			if !maps.Equal(prev.Slices[name], sl) && !changed[name] {
				t.Fatalf("slices of %s changed between two takes, not named changed", name)
			}
		}
		prev = cur
	}
}
