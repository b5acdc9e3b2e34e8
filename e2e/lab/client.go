package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Proto is the transport protocol of an echo exchange.
type Proto string

// The protocols the echo servers speak.
const (
	TCP  Proto = "tcp"
	UDP  Proto = "udp"
	SCTP Proto = "sctp"
)

// DefaultTimeout bounds an echo exchange whose Request sets no Timeout.
const DefaultTimeout = time.Second

// Request is one echo exchange: connect (or send) to Dst and read the pod's answer.
type Request struct {
	Proto Proto
	Dst   netip.AddrPort
	// Src optionally binds the client socket: an address, a port (with the zero Addr), or both.
	Src netip.AddrPort
	// Timeout bounds the whole exchange; zero means DefaultTimeout.
	Timeout time.Duration
}

// String returns the request in the packet notation of the project, e.g.
// "tcp -> 172.30.0.10:80".
func (r Request) String() string {
	if r.Src.Addr().IsValid() {
		return fmt.Sprintf("%s %s -> %s", r.Proto, r.Src, r.Dst)
	}
	return fmt.Sprintf("%s -> %s", r.Proto, r.Dst)
}

// Reply is a parsed echo answer.
type Reply struct {
	// Pod is the name of the pod that answered.
	Pod string
	// Source is the client address and port as the pod saw them (after any SNAT).
	Source netip.AddrPort
	// Local is the client socket's own address and port (before any SNAT).
	Local netip.AddrPort
}

// Errors that classify a failed exchange; test them with errors.Is.
var (
	// ErrRefused: the exchange was actively refused, fast: a TCP reset, an ICMP
	// unreachable (port, host, network, protocol), or an SCTP abort.
	ErrRefused = errors.New("refused")
	// ErrTimeout: no answer within the timeout; the packets were dropped somewhere.
	ErrTimeout = errors.New("timeout")
)

// Outcome is the class of an echo exchange's result.
type Outcome string

// The outcomes of an echo exchange.
const (
	Answered Outcome = "answered"
	Refused  Outcome = "refused"
	TimedOut Outcome = "timeout"
	Failed   Outcome = "failed" // anything else: a lab or usage error, an unsupported protocol
)

// Classify returns the outcome of an exchange that returned err.
func Classify(err error) Outcome {
	switch {
	case err == nil:
		return Answered
	case errors.Is(err, ErrRefused):
		return Refused
	case errors.Is(err, ErrTimeout):
		return TimedOut
	}
	return Failed
}

// refusals are the errnos the kernel reports for an active refusal.
var refusals = []syscall.Errno{
	unix.ECONNREFUSED, unix.ECONNRESET, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.ENOPROTOOPT,
}

// kind returns ErrRefused or ErrTimeout when err is one, else nil.
func kind(err error) error {
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return ErrTimeout
	}
	for _, e := range refusals {
		if errors.Is(err, e) {
			return ErrRefused
		}
	}
	return nil
}

// Echo runs one echo exchange from inside the namespace and returns the answer, or an error
// that wraps ErrRefused or ErrTimeout when the exchange was refused or timed out. It is safe
// for concurrent use; each call costs one socket and two namespace switches.
func (ns *NS) Echo(r Request) (Reply, error) {
	reply, err := ns.echo(r)
	if err != nil {
		if k := kind(err); k != nil {
			return Reply{}, fmt.Errorf("netns %s: echo %v: %w: %w", ns.name, r, k, err)
		}
		return Reply{}, fmt.Errorf("netns %s: echo %v: %w", ns.name, r, err)
	}
	return reply, nil
}

func (ns *NS) echo(r Request) (Reply, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	var c net.Conn
	var err error
	switch r.Proto {
	case TCP:
		d := net.Dialer{Deadline: deadline, Control: reuseAddr}
		if r.Src.Addr().IsValid() || r.Src.Port() != 0 {
			d.LocalAddr = net.TCPAddrFromAddrPort(r.Src)
		}
		err = ns.Do(func() (err error) {
			c, err = d.Dial("tcp", r.Dst.String())
			return err
		})
	case UDP:
		var laddr *net.UDPAddr
		if r.Src.Addr().IsValid() || r.Src.Port() != 0 {
			laddr = net.UDPAddrFromAddrPort(r.Src)
		}
		err = ns.Do(func() (err error) {
			c, err = net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(r.Dst))
			return err
		})
	case SCTP:
		c, err = ns.dialSCTP(r, deadline)
	default:
		return Reply{}, fmt.Errorf("protocol %q: %w", r.Proto, errors.ErrUnsupported)
	}
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	if err := c.SetDeadline(deadline); err != nil {
		return Reply{}, err
	}
	if _, err := c.Write([]byte("echo\n")); err != nil {
		return Reply{}, err
	}
	var line string
	if r.Proto == UDP {
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		if err != nil {
			return Reply{}, err
		}
		line = string(buf[:n])
	} else {
		br := bufio.NewReader(io.LimitReader(c, 512))
		line, err = br.ReadString('\n')
		if err != nil {
			return Reply{}, fmt.Errorf("read answer (got %q): %w", line, err)
		}
		// Wait for the server's FIN: the server then closes first and keeps the TIME_WAIT,
		// so the client can reuse its source port at once.
		_, _ = io.Copy(io.Discard, br)
	}
	reply, err := parseReply(line)
	if err != nil {
		return Reply{}, err
	}
	reply.Local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	return reply, nil
}

func parseReply(line string) (Reply, error) {
	f := strings.Fields(line)
	if len(f) != 2 {
		return Reply{}, fmt.Errorf("malformed answer %q", line)
	}
	src, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return Reply{}, fmt.Errorf("malformed answer %q: %w", line, err)
	}
	return Reply{Pod: f[0], Source: src}, nil
}

// reuseAddr lets a client rebind a source port whose last connection is still in TIME_WAIT.
func reuseAddr(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}

// dialSCTP opens an SCTP association to r.Dst from inside the namespace and hands it to
// the Go runtime as a stream connection.
func (ns *NS) dialSCTP(r Request, deadline time.Time) (net.Conn, error) {
	if !SCTPSupported() {
		return nil, fmt.Errorf("sctp: %w", errors.ErrUnsupported)
	}
	fd := -1
	err := ns.Do(func() error {
		var err error
		if fd, err = sctpSocket(r.Dst); err != nil {
			return err
		}
		if r.Src.Addr().IsValid() || r.Src.Port() != 0 {
			src := r.Src
			if !src.Addr().IsValid() {
				src = netip.AddrPortFrom(netip.IPv4Unspecified(), src.Port())
				if r.Dst.Addr().Is6() {
					src = netip.AddrPortFrom(netip.IPv6Unspecified(), src.Port())
				}
			}
			if err := unix.Bind(fd, sockaddr(src)); err != nil {
				return fmt.Errorf("sctp bind %v: %w", src, err)
			}
		}
		if err := unix.Connect(fd, sockaddr(r.Dst)); err != nil && err != unix.EINPROGRESS {
			return err
		}
		return nil
	})
	if fd < 0 {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "sctp "+r.Dst.String())
	defer f.Close() // FileConn dups the descriptor
	if err != nil {
		return nil, err
	}
	// Wait for the association outside the namespace: the socket is already bound to it.
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return nil, os.ErrDeadlineExceeded
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("sctp poll: %w", err)
		}
		if n == 0 {
			return nil, os.ErrDeadlineExceeded
		}
		break
	}
	soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return nil, fmt.Errorf("sctp SO_ERROR: %w", err)
	}
	if soerr != 0 {
		return nil, syscall.Errno(soerr)
	}
	return net.FileConn(f)
}
