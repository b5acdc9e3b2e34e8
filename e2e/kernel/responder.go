package kernel

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// responderName is the name the node's responder answers with, in place of a pod name.
// Pod names are addresses, so they never equal it.
const responderName = "node"

// responderIdle bounds how long the responder waits for a client's request line.
const responderIdle = 3 * time.Second

// responder answers TCP connections and UDP datagrams on the node's own addresses the
// way the pods' echo servers do ("node <source it saw>"), so that a packet delivered to
// the node without DNAT is told apart from one the node refused: it stands for whatever
// listens on a real node (sshd, the kubelet). Sockets are bound to each address rather
// than the wildcard, so that UDP answers leave from the address that was asked.
type responder struct {
	mu      sync.Mutex
	stopped bool
	closers []io.Closer
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// startResponder opens the sockets inside ns and serves them from ordinary goroutines.
func startResponder(ns *lab.NS, addrs []netip.Addr, ports []Port) (*responder, error) {
	r := &responder{conns: map[net.Conn]struct{}{}}
	if len(ports) == 0 {
		return r, nil
	}
	var streams []net.Listener
	var dgrams []*net.UDPConn
	err := ns.Do(func() error {
		for _, p := range ports {
			for _, a := range addrs {
				ap := netip.AddrPortFrom(a, p.Port)
				switch p.Proto {
				case lab.TCP:
					ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(ap))
					if err != nil {
						return fmt.Errorf("tcp %s: %w", ap, err)
					}
					r.closers = append(r.closers, ln)
					streams = append(streams, ln)
				case lab.UDP:
					pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
					if err != nil {
						return fmt.Errorf("udp %s: %w", ap, err)
					}
					r.closers = append(r.closers, pc)
					dgrams = append(dgrams, pc)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("netns %s: node responder: %w", ns, err), r.stop())
	}
	for _, ln := range streams {
		r.wg.Add(1)
		go r.serveStream(ln)
	}
	for _, pc := range dgrams {
		r.wg.Add(1)
		go r.serveDatagrams(pc)
	}
	return r, nil
}

func reply(src netip.AddrPort) []byte {
	return fmt.Appendf(nil, "%s %s\n", responderName, netip.AddrPortFrom(src.Addr().Unmap(), src.Port()))
}

func (r *responder) serveStream(ln net.Listener) {
	defer r.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by stop
		}
		r.mu.Lock()
		if r.stopped {
			r.mu.Unlock()
			c.Close()
			return
		}
		r.conns[c] = struct{}{}
		r.wg.Add(1)
		r.mu.Unlock()
		go r.answer(c)
	}
}

// answer reads the request line, replies and closes first, as the lab's clients expect.
func (r *responder) answer(c net.Conn) {
	defer r.wg.Done()
	defer func() {
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(responderIdle))
	if _, err := bufio.NewReader(io.LimitReader(c, 512)).ReadString('\n'); err != nil {
		return
	}
	if src, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		_, _ = c.Write(reply(src))
	}
}

func (r *responder) serveDatagrams(pc *net.UDPConn) {
	defer r.wg.Done()
	buf := make([]byte, 512)
	for {
		_, src, err := pc.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue // e.g. an ICMP error left by an earlier answer
		}
		_, _ = pc.WriteToUDPAddrPort(reply(src), src)
	}
}

// stop closes every socket and waits for the serving goroutines. It is idempotent.
func (r *responder) stop() error {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return nil
	}
	r.stopped = true
	var errs []error
	for _, c := range r.closers {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("node responder: %w", err))
		}
	}
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return errors.Join(errs...)
}
