package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NamePrefix starts the name of every namespace the lab creates, so that leftovers can be
// found (Leaks) and removed (RemoveStale) without touching anybody else's namespaces.
const NamePrefix = "nftp-"

// netnsDir is where named namespaces are bind-mounted (as by `ip netns add`).
const netnsDir = "/run/netns"

// ErrClosed is returned by NS methods called after Close.
var ErrClosed = errors.New("namespace closed")

// NS is a named network namespace made by the lab. It is bind-mounted under /run/netns, so
// `ip netns exec NAME ...` works on it while a spec is paused in a debugger.
//
// An NS never stands for the namespace the process started in: every method that touches the
// kernel runs inside the lab namespace or fails.
type NS struct {
	name string
	id   [2]uint64 // device and inode of the namespace file, to recognize references

	mu     sync.RWMutex
	handle netns.NsHandle
	closed bool
	stops  map[any]func() // stop long-running children (traces) on Close
}

// NewNS creates the network namespace name (which must start with NamePrefix), brings its
// loopback up and turns off IPv6 duplicate address detection so that addresses are usable
// at once. The caller owns the namespace and must Close it.
func NewNS(name string) (*NS, error) {
	if !strings.HasPrefix(name, NamePrefix) || strings.ContainsAny(name, "/ ") {
		return nil, fmt.Errorf("netns %q: name must start with %q and contain no '/' or space", name, NamePrefix)
	}
	handle, err := createNamed(name)
	if err != nil {
		return nil, fmt.Errorf("netns %s: create: %w", name, err)
	}
	ns := &NS{name: name, handle: handle, stops: map[any]func(){}}
	var st unix.Stat_t
	if err := unix.Fstat(int(handle), &st); err != nil {
		return nil, errors.Join(fmt.Errorf("netns %s: stat: %w", name, err), ns.Close())
	}
	ns.id = [2]uint64{uint64(st.Dev), uint64(st.Ino)}
	if err := ns.init(); err != nil {
		return nil, errors.Join(err, ns.Close())
	}
	return ns, nil
}

// createNamed creates and bind-mounts a namespace on a thread of its own, and returns that
// thread to the namespace it came from; netns.NewNamed leaves the calling thread inside.
func createNamed(name string) (netns.NsHandle, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{netns.None(), fmt.Errorf("get current namespace: %w", err)}
			return
		}
		defer origin.Close()
		h, err := netns.NewNamed(name)
		if serr := netns.Set(origin); serr != nil {
			// The thread stays locked and so dies with this goroutine: it must never
			// run anything else while inside the new namespace.
			if err == nil {
				h.Close()
				_ = netns.DeleteNamed(name)
			}
			done <- result{netns.None(), fmt.Errorf("switch back from new namespace: %w", serr)}
			return
		}
		runtime.UnlockOSThread()
		if err != nil {
			// NewNamed may fail after creating the mount point file.
			_ = os.Remove(filepath.Join(netnsDir, name))
		}
		done <- result{h, err}
	}()
	r := <-done
	return r.h, r.err
}

// init prepares a fresh namespace: loopback up and no DAD.
func (ns *NS) init() error {
	for _, kv := range [][2]string{
		{"net.ipv6.conf.all.accept_dad", "0"},
		{"net.ipv6.conf.default.accept_dad", "0"},
	} {
		if err := ns.SetSysctl(kv[0], kv[1]); err != nil {
			return err
		}
	}
	err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("link lo: %w", err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("link lo up: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netns %s: %w", ns.name, err)
	}
	return nil
}

// Name returns the namespace's name under /run/netns.
func (ns *NS) Name() string { return ns.name }

// String returns the namespace's name.
func (ns *NS) String() string { return ns.name }

// Do runs fn on an OS thread switched into the namespace, and switches the thread back
// afterwards, also when fn fails, panics (the panic is re-raised in the caller) or calls
// runtime.Goexit (reported as an error).
//
// Only the thread fn starts on is inside the namespace: goroutines fn starts are not. Sockets
// and child processes created inside fn stay in the namespace for their lifetime, so the
// pattern is to create them in fn and use them outside. The package-level functions of
// vishvananda/netlink open a fresh socket per call, so inside fn they act on the namespace.
// If the thread cannot be switched back it is left locked, which makes the Go runtime
// destroy it rather than reuse it.
func (ns *NS) Do(fn func() error) error {
	if ns == nil {
		return errors.New("netns: Do on a nil namespace")
	}
	type result struct {
		err      error
		panicked bool
		value    any
	}
	done := make(chan result, 1)
	go func() {
		var r result
		runtime.LockOSThread()
		origin, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("netns %s: get current namespace: %w", ns.name, err)}
			return
		}
		defer origin.Close()
		if err := ns.enter(); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		returned := false
		defer func() {
			if v := recover(); v != nil {
				r.panicked, r.value = true, v
			} else if !returned {
				r.err = fmt.Errorf("netns %s: function called runtime.Goexit", ns.name)
			}
			if err := netns.Set(origin); err != nil {
				r.err = errors.Join(r.err, fmt.Errorf("netns %s: switch back: %w", ns.name, err))
			} else {
				runtime.UnlockOSThread()
			}
			done <- r
		}()
		r.err = fn()
		returned = true
	}()
	r := <-done
	if r.panicked {
		panic(r.value)
	}
	return r.err
}

// enter switches the calling (locked) thread into the namespace.
func (ns *NS) enter() error {
	ns.mu.RLock()
	defer ns.mu.RUnlock()
	if ns.closed {
		return fmt.Errorf("netns %s: %w", ns.name, ErrClosed)
	}
	if err := netns.Set(ns.handle); err != nil {
		return fmt.Errorf("netns %s: enter: %w", ns.name, err)
	}
	return nil
}

// SetSysctl writes a sysctl of the namespace, e.g. SetSysctl("net.ipv4.ip_forward", "1").
// Keys use dots as separators, so interface names in keys must not contain dots.
func (ns *NS) SetSysctl(key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	err := ns.Do(func() error {
		// /proc/sys/net resolves the namespace of the opening thread, which is ours.
		return os.WriteFile(path, []byte(value), 0o644)
	})
	if err != nil {
		return fmt.Errorf("netns %s: sysctl %s=%s: %w", ns.name, key, value, err)
	}
	return nil
}

// Sysctl reads a sysctl of the namespace.
func (ns *NS) Sysctl(key string) (string, error) {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	var out []byte
	err := ns.Do(func() error {
		var err error
		out, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("netns %s: sysctl %s: %w", ns.name, key, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Exec runs a program inside the namespace with stdin as its input and returns its standard
// output. A failure carries the program's standard error.
func (ns *NS) Exec(ctx context.Context, stdin, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The child is forked from the locked thread and so starts in the namespace.
	err := ns.Do(cmd.Run)
	if err != nil {
		return stdout.String(), fmt.Errorf("netns %s: %s %s: %w: %s", ns.name, name,
			strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// track registers stop to be called by Close (for children such as traces); it fails, and
// calls stop, when the namespace is already closed.
func (ns *NS) track(key any, stop func()) error {
	ns.mu.Lock()
	if !ns.closed {
		ns.stops[key] = stop
		ns.mu.Unlock()
		return nil
	}
	ns.mu.Unlock()
	stop()
	return fmt.Errorf("netns %s: %w", ns.name, ErrClosed)
}

// untrack forgets a stop function registered by track.
func (ns *NS) untrack(key any) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	delete(ns.stops, key)
}

// FlushConntrack deletes every connection tracking entry (IPv4 and IPv6) of the namespace.
func (ns *NS) FlushConntrack() error {
	return ns.Do(func() error {
		// A flush request applies to the family in its header only.
		if err := netlink.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			return fmt.Errorf("netns %s: flush IPv4 conntrack: %w", ns.name, err)
		}
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET6, matchAll{}); err != nil {
			return fmt.Errorf("netns %s: flush IPv6 conntrack: %w", ns.name, err)
		}
		return nil
	})
}

// matchAll is a conntrack filter that matches every flow.
type matchAll struct{}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (matchAll) MatchConntrackFlow(*netlink.ConntrackFlow) bool { return true }

// Close kills the namespace's tracked children, releases its handles and removes its name.
// The kernel frees the namespace, and the veth ends inside it, once no socket refers to it
// any more. Close is idempotent.
func (ns *NS) Close() error {
	ns.mu.Lock()
	if ns.closed {
		ns.mu.Unlock()
		return nil
	}
	ns.closed = true
	stops := ns.stops
	ns.stops = nil
	ns.mu.Unlock()

	var errs []error
	for _, stop := range stops {
		stop()
	}
	if err := ns.handle.Close(); err != nil {
		errs = append(errs, fmt.Errorf("netns %s: close handle: %w", ns.name, err))
	}
	if err := netns.DeleteNamed(ns.name); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("netns %s: delete: %w", ns.name, err))
	}
	return errors.Join(errs...)
}
