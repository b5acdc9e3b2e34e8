package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// echoIdle bounds how long a pod's echo server waits for a client's request.
const echoIdle = 3 * time.Second

// EchoServer answers every TCP connection, UDP datagram and SCTP association on its
// addresses and ports with one line: "<name> <source address:port it saw>". Pods run
// one; a test may run one anywhere else, such as a node's own services.
type EchoServer struct {
	pod string

	mu      sync.Mutex
	stopped bool
	closers []io.Closer           // listeners and UDP sockets
	conns   map[net.Conn]struct{} // accepted connections being answered
	wg      sync.WaitGroup
}

// EchoPort is a protocol and port an EchoServer listens on.
type EchoPort struct {
	Proto Proto
	Port  uint16
}

// startEcho starts a pod's echo server: TCP, UDP and (where the kernel has it) SCTP on
// every port.
func startEcho(ns *NS, pod string, addrs []netip.Addr, ports []uint16) (*EchoServer, error) {
	var eps []EchoPort
	for _, port := range ports {
		eps = append(eps, EchoPort{TCP, port}, EchoPort{UDP, port})
		if SCTPSupported() {
			eps = append(eps, EchoPort{SCTP, port})
		}
	}
	return StartEcho(ns, pod, addrs, eps)
}

// StartEcho opens the sockets of ports on every address inside ns, then serves them
// from ordinary goroutines (a socket stays in the namespace it was created in),
// answering with name. Stop it with Stop.
func StartEcho(ns *NS, name string, addrs []netip.Addr, ports []EchoPort) (*EchoServer, error) {
	s := &EchoServer{pod: name, conns: map[net.Conn]struct{}{}}
	var streams []net.Listener
	var dgrams []*net.UDPConn
	err := ns.Do(func() error {
		for _, a := range addrs {
			for _, p := range ports {
				ap := netip.AddrPortFrom(a, p.Port)
				switch p.Proto {
				case TCP:
					ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(ap))
					if err != nil {
						return fmt.Errorf("tcp %s: %w", ap, err)
					}
					streams = append(streams, ln)
					s.closers = append(s.closers, ln)
				case UDP:
					pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
					if err != nil {
						return fmt.Errorf("udp %s: %w", ap, err)
					}
					dgrams = append(dgrams, pc)
					s.closers = append(s.closers, pc)
				case SCTP:
					ln, err := listenSCTP(ap)
					if err != nil {
						return fmt.Errorf("sctp %s: %w", ap, err)
					}
					streams = append(streams, ln)
					s.closers = append(s.closers, ln)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("netns %s: echo server %s: %w", ns.name, name, err), s.Stop())
	}
	for _, ln := range streams {
		s.wg.Add(1)
		go s.serveStream(ln)
	}
	for _, pc := range dgrams {
		s.wg.Add(1)
		go s.serveDatagrams(pc)
	}
	return s, nil
}

func (s *EchoServer) reply(src netip.AddrPort) []byte {
	return fmt.Appendf(nil, "%s %s\n", s.pod, netip.AddrPortFrom(src.Addr().Unmap(), src.Port()))
}

func (s *EchoServer) serveStream(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return // closed by stop
		}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.answer(c)
	}
}

// answer reads the client's request line, then replies and closes; reading first keeps the
// receive queue empty, so the close is a FIN and not a reset.
func (s *EchoServer) answer(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(echoIdle))
	if _, err := bufio.NewReader(io.LimitReader(c, 512)).ReadString('\n'); err != nil {
		return
	}
	if src, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		_, _ = c.Write(s.reply(src))
	}
}

func (s *EchoServer) serveDatagrams(pc *net.UDPConn) {
	defer s.wg.Done()
	buf := make([]byte, 512)
	for {
		_, src, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. ECONNREFUSED left by an earlier reply's ICMP error
		}
		_, _ = pc.WriteToUDPAddrPort(s.reply(src), src)
	}
}

// Stop closes every socket and waits for the serving goroutines.
func (s *EchoServer) Stop() error {
	s.mu.Lock()
	s.stopped = true
	var errs []error
	for _, c := range s.closers {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("echo server %s: %w", s.pod, err))
		}
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return errors.Join(errs...)
}

var sctpProbe struct {
	once sync.Once
	ok   bool
}

// SCTPSupported reports whether the kernel can open SCTP sockets. Without it, pods serve TCP
// and UDP only and SCTP echo requests fail with errors.ErrUnsupported; nftables can still
// match and NAT SCTP packets.
func SCTPSupported() bool {
	sctpProbe.once.Do(func() {
		// Opening (not binding) a socket changes nothing in any namespace.
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err == nil {
			unix.Close(fd)
			sctpProbe.ok = true
		}
	})
	return sctpProbe.ok
}

// sctpSocket opens a non-blocking one-to-one SCTP socket for ap's family; run inside Do.
func sctpSocket(ap netip.AddrPort) (int, error) {
	af := unix.AF_INET
	if ap.Addr().Is6() {
		af = unix.AF_INET6
	}
	fd, err := unix.Socket(af, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_SCTP)
	if err != nil {
		return -1, fmt.Errorf("sctp socket: %w", err)
	}
	return fd, nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is6() {
		return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
}

// listenSCTP listens on ap; run inside Do. The Go runtime serves the socket like a TCP one,
// which one-to-one SCTP sockets are compatible with for accept, read and write.
func listenSCTP(ap netip.AddrPort) (net.Listener, error) {
	fd, err := sctpSocket(ap)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "sctp "+ap.String())
	defer f.Close()
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return nil, fmt.Errorf("sctp %v: SO_REUSEADDR: %w", ap, err)
	}
	if ap.Addr().Is6() {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return nil, fmt.Errorf("sctp %v: IPV6_V6ONLY: %w", ap, err)
		}
	}
	if err := unix.Bind(fd, sockaddr(ap)); err != nil {
		return nil, fmt.Errorf("sctp %v: bind: %w", ap, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		return nil, fmt.Errorf("sctp %v: listen: %w", ap, err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("sctp %v: %w", ap, err)
	}
	return ln, nil
}
