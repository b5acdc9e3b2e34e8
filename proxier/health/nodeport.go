package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// ServiceHealthServer serves the health-check node ports of externalTrafficPolicy
// Local load balancers: one HTTP listener per Service's healthCheckNodePort, which
// answers 200 while the Service has ready endpoints on this node and 503 otherwise,
// so that the load balancer only sends traffic to nodes that can serve it locally.
type ServiceHealthServer struct {
	bindHost string
	healthy  func() bool
	log      *slog.Logger

	mu        sync.Mutex
	listeners map[uint16]*hcListener
	counts    map[state.ServiceName]int
	// ports is the health-check node port of each Service as the last sync saw
	// it, and failed is set while some port of it is not served.
	ports  map[state.ServiceName]uint16
	failed bool
}

// hcListener is the open listener of one health-check node port.
type hcListener struct {
	svc state.ServiceName
	l   net.Listener
	srv *http.Server
}

// ServiceHealth is the body of a health-check node port answer, as kube-proxy sends it.
type ServiceHealth struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// NewServiceHealthServer returns a server that listens on bindHost (empty for every
// address of the node). healthy reports the proxier's own health, which every
// answer includes (nil means always healthy); log may be nil.
func NewServiceHealthServer(bindHost string, healthy func() bool, log *slog.Logger) *ServiceHealthServer {
	if healthy == nil {
		healthy = func() bool { return true }
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &ServiceHealthServer{bindHost: bindHost, healthy: healthy, log: log,
		listeners: map[uint16]*hcListener{}, counts: map[state.ServiceName]int{}, ports: map[state.ServiceName]uint16{}}
}

// HealthChecks returns, for st, the health-check node port of every Service that has
// one and the number of its ready endpoints on this node (distinct address:port
// pairs over all its ports, as kube-proxy counts them).
func HealthChecks(st *state.ClusterState) (ports map[state.ServiceName]uint16, counts map[state.ServiceName]int) {
	ports, counts = map[state.ServiceName]uint16{}, map[state.ServiceName]int{}
	for name, svc := range st.Services {
		if svc.HealthCheckNodePort != 0 {
			ports[name], counts[name] = svc.HealthCheckNodePort, localEndpoints(st, svc)
		}
	}
	return ports, counts
}

// localEndpoints counts the ready endpoints of svc on this node.
func localEndpoints(st *state.ClusterState, svc *state.Service) int {
	local := map[netip.AddrPort]bool{}
	for _, p := range svc.Ports {
		for _, ep := range st.Endpoints(svc, p) {
			if ep.Ready && st.Node.Name != "" && ep.NodeName == st.Node.Name {
				local[ep.AddrPort()] = true
			}
		}
	}
	return len(local)
}

// Sync makes the listeners match st: it opens the ports of new Services, closes
// those of Services that went away or changed port, and updates every count. Ports
// that cannot be opened are reported and retried on the next Sync or SyncChanged.
func (s *ServiceHealthServer) Sync(st *state.ClusterState) error {
	ports, counts := HealthChecks(st)
	s.mu.Lock()
	s.counts = counts
	s.ports = ports
	s.mu.Unlock()
	return s.syncPorts(ports)
}

// SyncChanged is Sync for a st in which only the Services in changed may differ
// from the state of the previous Sync or SyncChanged: it reads those alone, and
// opens and closes listeners only when their ports changed or an earlier port
// could not be opened.
func (s *ServiceHealthServer) SyncChanged(st *state.ClusterState, changed map[state.ServiceName]bool) error {
	s.mu.Lock()
	moved := s.failed
	for name := range changed {
		svc := st.Services[name]
		if svc == nil || svc.HealthCheckNodePort == 0 {
			_, had := s.ports[name]
			moved = moved || had
			delete(s.ports, name)
			delete(s.counts, name)
			continue
		}
		moved = moved || s.ports[name] != svc.HealthCheckNodePort
		s.ports[name] = svc.HealthCheckNodePort
		s.counts[name] = localEndpoints(st, svc)
	}
	var ports map[state.ServiceName]uint16
	if moved {
		ports = maps.Clone(s.ports)
	}
	s.mu.Unlock()
	if !moved {
		return nil
	}
	return s.syncPorts(ports)
}

// syncPorts opens and closes listeners so that exactly ports are served.
func (s *ServiceHealthServer) syncPorts(ports map[state.ServiceName]uint16) error {
	want := map[uint16]state.ServiceName{}
	var errs []error
	for _, name := range sortedNames(ports) {
		p := ports[name]
		if other, dup := want[p]; dup {
			errs = append(errs, fmt.Errorf("service %s: healthCheckNodePort %d already used by service %s", name, p, other))
			continue
		}
		want[p] = name
	}
	s.mu.Lock()
	var closing []*hcListener
	for p, hl := range s.listeners {
		if svc, ok := want[p]; !ok || svc != hl.svc {
			closing = append(closing, hl)
			delete(s.listeners, p)
		}
	}
	s.mu.Unlock()
	for _, hl := range closing {
		s.log.Info("closing health check node port", "service", hl.svc.String(), "port", hl.l.Addr().String())
		hl.close()
	}
	for p, name := range want {
		if err := s.open(p, name); err != nil {
			errs = append(errs, err)
		}
	}
	s.mu.Lock()
	s.failed = len(errs) > 0
	s.mu.Unlock()
	return errors.Join(errs...)
}

// open starts the listener of port p for Service name, unless it is open already.
func (s *ServiceHealthServer) open(p uint16, name state.ServiceName) error {
	s.mu.Lock()
	_, open := s.listeners[p]
	s.mu.Unlock()
	if open {
		return nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(s.bindHost, strconv.Itoa(int(p))))
	if err != nil {
		return fmt.Errorf("service %s: healthCheckNodePort %d: %w", name, p, err)
	}
	hl := &hcListener{svc: name, l: l}
	hl.srv = &http.Server{Handler: s.handler(name), ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	s.listeners[p] = hl
	s.mu.Unlock()
	s.log.Info("serving health check node port", "service", name.String(), "port", l.Addr().String())
	go func() { _ = hl.srv.Serve(l) }()
	return nil
}

func (s *ServiceHealthServer) handler(name state.ServiceName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var body ServiceHealth
		body.Service.Namespace, body.Service.Name = name.Namespace, name.Name
		s.mu.Lock()
		body.LocalEndpoints = s.counts[name]
		s.mu.Unlock()
		body.ServiceProxyHealthy = s.healthy()
		code := http.StatusOK
		if body.LocalEndpoints == 0 || !body.ServiceProxyHealthy {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, body)
	})
}

// close stops serving hl. It closes the listener itself too: the server only
// closes the listeners its Serve has begun with, and a Serve that has not begun
// yet would leave the port bound for a while, so that reopening it could fail.
func (hl *hcListener) close() {
	_ = hl.srv.Close()
	_ = hl.l.Close()
}

// Ports returns the health-check node ports currently served, by Service.
func (s *ServiceHealthServer) Ports() map[state.ServiceName]uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[state.ServiceName]uint16{}
	for p, hl := range s.listeners {
		out[hl.svc] = p
	}
	return out
}

// Close closes every listener.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	ls := s.listeners
	s.listeners = map[uint16]*hcListener{}
	s.mu.Unlock()
	for _, hl := range ls {
		hl.close()
	}
}

// Run closes every listener when ctx is done.
func (s *ServiceHealthServer) Run(ctx context.Context) {
	<-ctx.Done()
	s.Close()
}

func sortedNames[V any](m map[state.ServiceName]V) []state.ServiceName {
	out := make([]state.ServiceName, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
