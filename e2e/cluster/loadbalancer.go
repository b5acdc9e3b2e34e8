package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// The lab's cloud load balancer: a namespace on the segment whose address is the
// LoadBalancer's VIP. It asks every node's health-check node port (the Service's
// spec.healthCheckNodePort, externalTrafficPolicy Local) a few times a second, as cloud
// load balancers do, and forwards each TCP connection it accepts to the node port of the
// next node whose last answer was 200 (a proxying load balancer: the backends see its
// address).

// lbCheckPeriod is the time between two rounds of health checks.
const lbCheckPeriod = 250 * time.Millisecond

// LoadBalancer is a running load balancer; Stop ends it.
type LoadBalancer struct {
	NS *lab.NS
	// VIP is where clients connect.
	VIP netip.AddrPort

	c                *Cluster
	nodePort, hcPort uint16
	ln               net.Listener
	stop             chan struct{}
	wg               sync.WaitGroup

	mu      sync.Mutex
	healthy map[string]bool // by node, the last health check's verdict
	picks   map[string]int  // connections forwarded, by node
	events  []string        // health changes, for the log
	next    int
	conns   map[net.Conn]bool
}

// StartLoadBalancer creates the load-balancer namespace with the address vip on the segment
// and forwards vip's TCP connections to the node port of healthy nodes, those whose
// health-check node port hcPort answers 200. Stop it before Close.
func (c *Cluster) StartLoadBalancer(vip netip.AddrPort, nodePort, hcPort uint16) (*LoadBalancer, error) {
	if !c.Spec.Segment.Contains(vip.Addr()) {
		return nil, fmt.Errorf("load balancer %s: not in the segment %s", vip, c.Spec.Segment)
	}
	ns, err := c.newNS("lb", nil)
	if err != nil {
		return nil, err
	}
	if err := plug(c.Segment, "lb", ns, netip.PrefixFrom(vip.Addr(), c.Spec.Segment.Bits())); err != nil {
		return nil, err
	}
	lb := &LoadBalancer{NS: ns, VIP: vip, c: c, nodePort: nodePort, hcPort: hcPort, stop: make(chan struct{}),
		healthy: map[string]bool{}, picks: map[string]int{}, conns: map[net.Conn]bool{}}
	err = ns.Do(func() (err error) {
		lb.ln, err = net.Listen("tcp", vip.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load balancer %s: %w", vip, err)
	}
	lb.check() // a first verdict before the first connection
	lb.wg.Add(2)
	go lb.checkLoop()
	go lb.accept()
	return lb, nil
}

// Healthy returns the nodes the last health checks found healthy.
func (lb *LoadBalancer) Healthy() []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	var out []string
	for n, ok := range lb.healthy {
		if ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Picks returns how many connections went to each node.
func (lb *LoadBalancer) Picks() map[string]int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := map[string]int{}
	for n, v := range lb.picks {
		out[n] = v
	}
	return out
}

// Events returns the health changes seen, in order.
func (lb *LoadBalancer) Events() []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return slices.Clone(lb.events)
}

// Stop closes the listener and the forwarded connections and waits for them.
func (lb *LoadBalancer) Stop() {
	select {
	case <-lb.stop:
		return
	default:
		close(lb.stop)
	}
	lb.ln.Close()
	lb.mu.Lock()
	for c := range lb.conns {
		c.Close()
	}
	lb.mu.Unlock()
	lb.wg.Wait()
}

func (lb *LoadBalancer) checkLoop() {
	defer lb.wg.Done()
	for {
		select {
		case <-lb.stop:
			return
		case <-time.After(lbCheckPeriod):
		}
		lb.check()
	}
}

// check asks every node's health-check node port at once.
func (lb *LoadBalancer) check() {
	nodes := slices.Clone(lb.c.Nodes)
	verdicts := make([]bool, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			code, _, err := httpGet(ctx, lb.NS, fmt.Sprintf("http://%s/", netip.AddrPortFrom(n.Addr, lb.hcPort)))
			verdicts[i] = err == nil && code == http.StatusOK
		})
	}
	wg.Wait()
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for i, n := range nodes {
		name := n.Spec.Name
		if was, seen := lb.healthy[name]; !seen || was != verdicts[i] {
			lb.events = append(lb.events, fmt.Sprintf("%s %s healthy=%v", time.Now().Format("15:04:05.000"), name, verdicts[i]))
		}
		lb.healthy[name] = verdicts[i]
	}
}

// pick returns the next healthy node, round robin, or nil.
func (lb *LoadBalancer) pick() *Node {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	nodes := lb.c.Nodes
	for range nodes {
		lb.next++
		n := nodes[lb.next%len(nodes)]
		if lb.healthy[n.Spec.Name] {
			lb.picks[n.Spec.Name]++
			return n
		}
	}
	return nil
}

func (lb *LoadBalancer) accept() {
	defer lb.wg.Done()
	for {
		in, err := lb.ln.Accept()
		if err != nil {
			return // closed by Stop
		}
		lb.wg.Add(1)
		go lb.forward(in)
	}
}

// forward relays in to the node port of a healthy node; without one, in is closed.
func (lb *LoadBalancer) forward(in net.Conn) {
	defer lb.wg.Done()
	defer in.Close()
	n := lb.pick()
	if n == nil {
		return
	}
	var out net.Conn
	err := lb.NS.Do(func() (err error) {
		out, err = net.DialTimeout("tcp", netip.AddrPortFrom(n.Addr, lb.nodePort).String(), 3*time.Second)
		return err
	})
	if err != nil {
		return
	}
	defer out.Close()
	lb.mu.Lock()
	stopped := false
	select {
	case <-lb.stop:
		stopped = true
	default:
		lb.conns[in], lb.conns[out] = true, true
	}
	lb.mu.Unlock()
	if stopped {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(out, in)
		out.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(in, out)
	in.(*net.TCPConn).CloseWrite()
	<-done
	lb.mu.Lock()
	delete(lb.conns, in)
	delete(lb.conns, out)
	lb.mu.Unlock()
}

// httpGet gets url from inside ns.
func httpGet(ctx context.Context, ns *lab.NS, url string) (int, string, error) {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := ns.Do(func() error {
				var err error
				conn, err = (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
