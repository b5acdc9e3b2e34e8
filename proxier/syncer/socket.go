package syncer

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// kernelSocket is the NETLINK_NETFILTER socket a KernelNetlink Transport sends its
// batches on, kept open from one batch to the next.
//
// Closing a netfilter netlink socket is what makes a deleting sync slow, not the
// deletion: on the socket's release the kernel (nft_rcv_nl_event, on
// NETLINK_URELEASE) flushes nf_tables' destroy work whenever a committed
// transaction left objects to free, and that work waits for an RCU grace period
// before freeing them. A batch that deletes one element commits in well under a
// millisecond, and the close after it then blocks for the grace period (10-25 ms
// on a 2-core VM); after a batch that only adds, there is nothing to free and the
// close returns at once. With the socket kept open, the freeing happens in the
// kernel's worker, off the sync. (An nft process pays the same wait at its exit:
// README, "Scale: tools/bench".)
type kernelSocket struct {
	do func(func() error) error
	mu sync.Mutex
	// fd is the open socket, or -1.
	fd *int
}

// newKernelSocket returns a kernelSocket opening its socket inside do. Its socket is
// closed once the kernelSocket is garbage, as a Transport made for a test's
// namespace would otherwise keep that namespace alive.
func newKernelSocket(do func(func() error) error) *kernelSocket {
	fd := -1
	s := &kernelSocket{do: do, fd: &fd}
	runtime.AddCleanup(s, func(fd *int) {
		if *fd >= 0 {
			_ = unix.Close(*fd)
		}
	}, s.fd)
	return s
}

// send sends f on the socket, opening it first if need be, and waits for the
// acknowledgement of message ack. After an error the socket may hold the answers
// to the rest of the batch, so it is closed.
func (s *kernelSocket) send(ctx context.Context, f *frame, ack uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *s.fd < 0 {
		fd, err := s.open()
		if err != nil {
			return err
		}
		*s.fd = fd
	}
	if err := f.send(ctx, *s.fd, ack); err != nil {
		_ = unix.Close(*s.fd)
		*s.fd = -1
		return err
	}
	return nil
}

// open opens a socket inside s.do and sets it up: a receive buffer for the
// kernel's answers, and errors that name what failed without echoing the message.
func (s *kernelSocket) open() (int, error) {
	fd := -1
	open := func() (err error) {
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	}
	if err := s.do(open); err != nil {
		return -1, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 1<<20); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("netlink socket buffer of %d bytes: %w", 1<<20, err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	return fd, nil
}

// close closes the socket if it is open.
func (s *kernelSocket) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *s.fd < 0 {
		return nil
	}
	err := unix.Close(*s.fd)
	*s.fd = -1
	if err != nil {
		return fmt.Errorf("closing the netlink socket: %w", err)
	}
	return nil
}
