package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// Clients connected throughout an operation: a Traffic opens a new TCP connection every
// 20-50 ms (each in its own goroutine, so an outage does not slow the rate down) and keeps
// long-lived connections exchanging a line every HeldPeriod, and counts what failed.

// TrafficSpec describes a continuous client.
type TrafficSpec struct {
	// Name names the client in reports.
	Name string
	// From is the client's namespace: a pod's, or the external one.
	From *lab.NS
	// Targets receive the new connections in turn (echo ports: one answer, then closed).
	Targets []netip.AddrPort
	// Held are stream ports (PodSpec.StreamPorts behind a Service): one long-lived
	// connection is kept to each, reopened when it breaks.
	Held []netip.AddrPort
	// Timeout bounds a connection and a held connection's exchange; zero: 3s.
	Timeout time.Duration
	// HeldPeriod is the time between two exchanges on a held connection; zero: 200ms.
	HeldPeriod time.Duration
}

// The classes of a failed connection.
const (
	FailRefused = "refused" // a reset or ICMP error in answer to the SYN
	FailTimeout = "timeout" // no answer
	FailReset   = "reset"   // reset (or closed) after the connection was made
	FailOther   = "other"
)

// TrafficCounts are what a Traffic saw.
type TrafficCounts struct {
	// Attempts new connections were made; Answered got their answer.
	Attempts, Answered int
	// Failed counts the new connections that failed, by class (FailRefused, ...).
	Failed map[string]int
	// Reached counts the answers by pod.
	Reached map[string]int
	// HeldExchanges were made on long-lived connections; HeldBroken connections broke
	// (an exchange failed on a connection that had worked); HeldReopenFailed attempts to
	// open one failed.
	HeldExchanges, HeldBroken, HeldReopenFailed int
	// Errors are the first few errors, for the log.
	Errors []string
}

// Failures is the number of failed new connections and broken held ones.
func (c TrafficCounts) Failures() int {
	n := c.HeldBroken + c.HeldReopenFailed
	for _, v := range c.Failed {
		n += v
	}
	return n
}

func (c TrafficCounts) String() string {
	s := fmt.Sprintf("%d new connections, %d answered, failed %v; held: %d exchanges, %d broken, %d failed to open; reached %v",
		c.Attempts, c.Answered, c.Failed, c.HeldExchanges, c.HeldBroken, c.HeldReopenFailed, c.Reached)
	if len(c.Errors) > 0 {
		s += "; first errors: " + strings.Join(c.Errors, "; ")
	}
	return s
}

// maxErrors bounds TrafficCounts.Errors.
const maxErrors = 5

// Traffic is a running continuous client.
type Traffic struct {
	spec TrafficSpec
	stop chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	counts TrafficCounts
	conns  map[net.Conn]bool // the open held connections, closed by Stop
}

// StartTraffic starts a continuous client; Stop ends it.
func StartTraffic(spec TrafficSpec) (*Traffic, error) {
	if spec.From == nil || len(spec.Targets)+len(spec.Held) == 0 {
		return nil, fmt.Errorf("traffic %s: want a namespace and targets", spec.Name)
	}
	if spec.Timeout <= 0 {
		spec.Timeout = 3 * time.Second
	}
	if spec.HeldPeriod <= 0 {
		spec.HeldPeriod = 200 * time.Millisecond
	}
	t := &Traffic{spec: spec, stop: make(chan struct{}), conns: map[net.Conn]bool{},
		counts: TrafficCounts{Failed: map[string]int{}, Reached: map[string]int{}}}
	if len(spec.Targets) > 0 {
		t.wg.Add(1)
		go t.newConnections()
	}
	for _, dst := range spec.Held {
		t.wg.Add(1)
		go t.held(dst)
	}
	return t, nil
}

// Snapshot returns the counts so far.
func (t *Traffic) Snapshot() TrafficCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.counts
	c.Failed, c.Reached, c.Errors = maps.Clone(c.Failed), maps.Clone(c.Reached), slices.Clone(c.Errors)
	return c
}

// Stop stops the client, waits for its connections and returns the counts.
func (t *Traffic) Stop() TrafficCounts {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return t.Snapshot()
}

func (t *Traffic) stopped() bool {
	select {
	case <-t.stop:
		return true
	default:
		return false
	}
}

// failed counts a failure with count (under the lock) and keeps its error for the log.
func (t *Traffic) failed(count func(*TrafficCounts), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	count(&t.counts)
	if len(t.counts.Errors) < maxErrors {
		t.counts.Errors = append(t.counts.Errors, time.Now().Format("15:04:05.000")+" "+err.Error())
	}
}

// newConnections starts a connection every 20-50 ms until Stop.
func (t *Traffic) newConnections() {
	defer t.wg.Done()
	for i := 0; ; i++ {
		select {
		case <-t.stop:
			return
		case <-time.After(time.Duration(20+rand.IntN(31)) * time.Millisecond):
		}
		dst := t.spec.Targets[i%len(t.spec.Targets)]
		t.mu.Lock()
		t.counts.Attempts++
		t.mu.Unlock()
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			r, err := t.spec.From.Echo(lab.Request{Proto: lab.TCP, Dst: dst, Timeout: t.spec.Timeout})
			if err != nil {
				t.failed(func(c *TrafficCounts) { c.Failed[failClass(err)]++ }, fmt.Errorf("%s: %w", t.spec.Name, err))
				return
			}
			t.mu.Lock()
			t.counts.Answered++
			t.counts.Reached[r.Pod]++
			t.mu.Unlock()
		}()
	}
}

// held keeps one long-lived connection to dst, reopening it when it breaks.
func (t *Traffic) held(dst netip.AddrPort) {
	defer t.wg.Done()
	for !t.stopped() {
		c, err := t.dial(dst)
		if err != nil {
			if !t.stopped() {
				t.failed(func(c *TrafficCounts) { c.HeldReopenFailed++ },
					fmt.Errorf("%s: open held connection to %s (%s): %w", t.spec.Name, dst, failClass(err), err))
			}
			time.Sleep(t.spec.HeldPeriod)
			continue
		}
		err = t.exchange(c)
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
		c.Close()
		if err != nil && !t.stopped() {
			t.failed(func(c *TrafficCounts) { c.HeldBroken++ },
				fmt.Errorf("%s: held connection to %s broke (%s): %w", t.spec.Name, dst, failClass(err), err))
		}
	}
}

// dial opens a connection to dst from the client's namespace, registered for Stop.
func (t *Traffic) dial(dst netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := t.spec.From.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", dst.String(), t.spec.Timeout)
		return err
	})
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped() {
		c.Close()
		return nil, net.ErrClosed
	}
	t.conns[c] = true
	return c, nil
}

// exchange sends a line every HeldPeriod and reads its answer until Stop (nil) or a
// failure.
func (t *Traffic) exchange(c net.Conn) error {
	r := bufio.NewReader(c)
	for i := 0; ; i++ {
		if err := c.SetDeadline(time.Now().Add(t.spec.Timeout)); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(c, "%d\n", i); err != nil {
			return t.unlessStopped(err)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return t.unlessStopped(err)
		}
		if f := strings.Fields(line); len(f) != 2 || f[1] != fmt.Sprint(i) {
			return fmt.Errorf("answer %q to line %d", line, i)
		}
		t.mu.Lock()
		t.counts.HeldExchanges++
		t.mu.Unlock()
		select {
		case <-t.stop:
			return nil
		case <-time.After(t.spec.HeldPeriod):
		}
	}
}

func (t *Traffic) unlessStopped(err error) error {
	if t.stopped() {
		return nil
	}
	return err
}

// failClass returns the class of a connection's error.
func failClass(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF):
		return FailReset
	case errors.Is(err, lab.ErrTimeout), errors.As(err, &ne) && ne.Timeout():
		return FailTimeout
	case errors.Is(err, lab.ErrRefused), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return FailRefused
	}
	return FailOther
}

// streamServer answers every line of its connections with "POD LINE" until the client
// closes: the far end of Traffic's held connections.
type streamServer struct {
	pod   string
	wg    sync.WaitGroup
	mu    sync.Mutex
	socks map[io.Closer]bool // listeners and connections
}

// startStreamServer listens on addr's ports inside ns.
func startStreamServer(ns *lab.NS, pod string, addr netip.Addr, ports []uint16) (*streamServer, error) {
	s := &streamServer{pod: pod, socks: map[io.Closer]bool{}}
	for _, port := range ports {
		var ln net.Listener
		err := ns.Do(func() (err error) {
			ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
			return err
		})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("pod %s: stream port %d: %w", pod, port, err), s.stop())
		}
		s.track(ln)
		s.wg.Add(1)
		go s.serve(ln)
	}
	return s, nil
}

func (s *streamServer) track(c io.Closer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.socks[c] = true
}

func (s *streamServer) serve(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by stop
		}
		s.track(c)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := fmt.Fprintf(c, "%s %s", s.pod, line); err != nil {
					return
				}
			}
		}()
	}
}

// stop closes the listeners and connections and waits for their goroutines.
func (s *streamServer) stop() error {
	s.mu.Lock()
	for c := range s.socks {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
