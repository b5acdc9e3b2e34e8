package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a moment ago.
func freePorts(t *testing.T, n int) []uint16 {
	t.Helper()
	var ports []uint16
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, uint16(l.Addr().(*net.TCPAddr).Port))
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

func addService(st *state.ClusterState, ns, name string, hcPort uint16, eps ...state.SliceEndpoint) {
	n := state.ServiceName{Namespace: ns, Name: name}
	st.Services[n] = &state.Service{Name: n, Type: "LoadBalancer", ExternalPolicyLocal: true,
		HealthCheckNodePort: hcPort,
		Ports:               []state.ServicePort{{Name: "http", Protocol: state.TCP, Port: 80, NodePort: 30080}}}
	st.Slices[n] = map[string]*state.EndpointSlice{name + "-1": {
		Name: name + "-1", Service: n,
		Ports:     []state.EndpointPort{{Name: "http", Protocol: state.TCP, Port: 8080}},
		Endpoints: eps,
	}}
}

func ep(addr, node string, ready bool) state.SliceEndpoint {
	return state.SliceEndpoint{Address: netip.MustParseAddr(addr), NodeName: node, Ready: ready, Serving: ready}
}

// probe asks a health-check node port and returns the code and body.
func probe(t *testing.T, port uint16) (int, ServiceHealth) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		t.Fatalf("probe port %d: %v", port, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var body ServiceHealth
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("port %d body %q: %v", port, raw, err)
	}
	return resp.StatusCode, body
}

func TestServiceHealthServerCountsLocalReadyEndpoints(t *testing.T) {
	ports := freePorts(t, 2)
	st := state.NewClusterState()
	st.Node.Name = "node-a"
	addService(st, "default", "web", ports[0],
		ep("10.1.0.1", "node-a", true), ep("10.1.0.2", "node-a", true),
		ep("10.1.0.3", "node-a", false), ep("10.1.0.4", "node-b", true))
	addService(st, "default", "remote", ports[1], ep("10.1.0.9", "node-b", true))

	s := NewServiceHealthServer("127.0.0.1", nil, nil)
	defer s.Close()
	if err := s.Sync(st); err != nil {
		t.Fatalf("sync: %v", err)
	}
	code, body := probe(t, ports[0])
	if code != http.StatusOK || body.LocalEndpoints != 2 || !body.ServiceProxyHealthy ||
		body.Service.Namespace != "default" || body.Service.Name != "web" {
		t.Errorf("web: %d %+v, want 200 with 2 local endpoints", code, body)
	}
	code, body = probe(t, ports[1])
	if code != http.StatusServiceUnavailable || body.LocalEndpoints != 0 {
		t.Errorf("remote: %d %+v, want 503 with 0 local endpoints", code, body)
	}

	// The remote Service gains a local endpoint; web goes away.
	addService(st, "default", "remote", ports[1], ep("10.1.0.10", "node-a", true))
	delete(st.Services, state.ServiceName{Namespace: "default", Name: "web"})
	if err := s.Sync(st); err != nil {
		t.Fatalf("second sync: %v", err)
	}
	if code, body := probe(t, ports[1]); code != http.StatusOK || body.LocalEndpoints != 1 {
		t.Errorf("remote after gaining an endpoint: %d %+v, want 200 with 1", code, body)
	}
	_, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("port of the deleted Service: dial error %v, want connection refused", err)
	}
	if got := s.Ports(); len(got) != 1 {
		t.Errorf("ports served = %v, want only remote's", got)
	}
}

func TestServiceHealthServerReportsProxierHealth(t *testing.T) {
	ports := freePorts(t, 1)
	st := state.NewClusterState()
	st.Node.Name = "node-a"
	addService(st, "ns", "lb", ports[0], ep("10.1.0.1", "node-a", true))
	s := NewServiceHealthServer("127.0.0.1", func() bool { return false }, nil)
	defer s.Close()
	if err := s.Sync(st); err != nil {
		t.Fatal(err)
	}
	if code, body := probe(t, ports[0]); code != http.StatusServiceUnavailable || body.ServiceProxyHealthy || body.LocalEndpoints != 1 {
		t.Errorf("unhealthy proxier: %d %+v, want 503, serviceProxyHealthy false", code, body)
	}
}

func TestServiceHealthServerErrorsNameTheService(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := uint16(busy.Addr().(*net.TCPAddr).Port)
	free := freePorts(t, 1)[0]
	st := state.NewClusterState()
	addService(st, "ns", "taken", busyPort)
	addService(st, "ns", "a", free)
	addService(st, "ns", "b", free)

	s := NewServiceHealthServer("127.0.0.1", nil, nil)
	defer s.Close()
	err = s.Sync(st)
	if err == nil {
		t.Fatal("sync with a busy port and a duplicate port succeeded")
	}
	for _, want := range []string{fmt.Sprintf("service ns/taken: healthCheckNodePort %d", busyPort),
		fmt.Sprintf("service ns/b: healthCheckNodePort %d already used by service ns/a", free)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if code, _ := probe(t, free); code != http.StatusServiceUnavailable {
		t.Errorf("ns/a (no endpoints) answered %d, want 503", code)
	}
}

// TestServiceHealthServerSyncChangedEqualsSync changes random Services (their
// health-check node port, from a small pool so that Services share one, and their
// local endpoints) and checks that a server told only of the changed Services
// serves the ports and counts a server synced with the whole state serves, and
// fails alike.
func TestServiceHealthServerSyncChangedEqualsSync(t *testing.T) {
	pool := append(freePorts(t, 3), 0)
	rng := rand.New(rand.NewPCG(1, 2))
	full := NewServiceHealthServer("127.0.0.1", nil, nil)
	defer full.Close()
	inc := NewServiceHealthServer("127.0.0.2", nil, nil)
	defer inc.Close()
	st := state.NewClusterState()
	st.Node.Name = "node-a"
	for step := range 200 {
		next := &state.ClusterState{Node: st.Node, Services: maps.Clone(st.Services), Slices: maps.Clone(st.Slices)}
		changed := map[state.ServiceName]bool{}
		for range 1 + rng.IntN(2) {
			name := fmt.Sprint("svc-", rng.IntN(6))
			n := state.ServiceName{Namespace: "ns", Name: name}
			changed[n] = true
			if rng.IntN(4) == 0 {
				delete(next.Services, n)
				continue
			}
			var eps []state.SliceEndpoint
			for i := range rng.IntN(4) {
				eps = append(eps, ep(fmt.Sprint("10.1.0.", i), []string{"node-a", "node-b"}[rng.IntN(2)], rng.IntN(3) > 0))
			}
			addService(next, "ns", name, pool[rng.IntN(len(pool))], eps...)
		}
		errFull, errInc := full.Sync(next), inc.SyncChanged(next, changed)
		if (errFull == nil) != (errInc == nil) {
			t.Fatalf("step %d: Sync error %v, SyncChanged error %v", step, errFull, errInc)
		}
		if got, want := inc.Ports(), full.Ports(); !maps.Equal(got, want) {
			t.Fatalf("step %d: SyncChanged serves %v, Sync %v", step, got, want)
		}
		if !maps.Equal(inc.counts, full.counts) {
			t.Fatalf("step %d: SyncChanged counts %v, Sync %v", step, inc.counts, full.counts)
		}
		st = next
	}
}
