package lab

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/knftables"
)

// NFT returns a real knftables.Interface for family and table whose every call, including
// the construction-time checks, runs the `nft` binary inside ns.
func NFT(ns *NS, family knftables.Family, table string, options ...knftables.Option) (knftables.Interface, error) {
	var inner knftables.Interface
	err := ns.Do(func() (err error) {
		inner, err = knftables.New(family, table, options...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns %s: knftables %s %s: %w", ns.name, family, table, err)
	}
	return &nsNFT{ns: ns, inner: inner}, nil
}

// nsNFT runs a knftables.Interface inside a namespace. Errors of the inner interface are
// returned unwrapped so that knftables.IsNotFound and IsAlreadyExists keep working.
type nsNFT struct {
	ns    *NS
	inner knftables.Interface
}

var _ knftables.Interface = (*nsNFT)(nil)

// NewTransaction implements knftables.Interface; it runs no command.
func (n *nsNFT) NewTransaction() *knftables.Transaction { return n.inner.NewTransaction() }

// Run implements knftables.Interface.
func (n *nsNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.ns.Do(func() error { return n.inner.Run(ctx, tx) })
}

// Check implements knftables.Interface.
func (n *nsNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return n.ns.Do(func() error { return n.inner.Check(ctx, tx) })
}

// ListAll implements knftables.Interface.
func (n *nsNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = n.ns.Do(func() error { out, err = n.inner.ListAll(ctx); return err })
	return out, err
}

// List implements knftables.Interface.
func (n *nsNFT) List(ctx context.Context, objectType string) (out []string, err error) {
	err = n.ns.Do(func() error { out, err = n.inner.List(ctx, objectType); return err })
	return out, err
}

// ListRules implements knftables.Interface.
func (n *nsNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = n.ns.Do(func() error { out, err = n.inner.ListRules(ctx, chain); return err })
	return out, err
}

// ListElements implements knftables.Interface.
func (n *nsNFT) ListElements(ctx context.Context, objectType, name string) (out []*knftables.Element, err error) {
	err = n.ns.Do(func() error { out, err = n.inner.ListElements(ctx, objectType, name); return err })
	return out, err
}

// ListCounters implements knftables.Interface.
func (n *nsNFT) ListCounters(ctx context.Context) (out []*knftables.Counter, err error) {
	err = n.ns.Do(func() error { out, err = n.inner.ListCounters(ctx); return err })
	return out, err
}

// NFTApply loads an nft script (as `nft -f -`) in the namespace.
func (ns *NS) NFTApply(ctx context.Context, script string) error {
	_, err := ns.Exec(ctx, script, "nft", "-f", "-")
	return err
}

// Ruleset returns `nft list ruleset` of the namespace.
func (ns *NS) Ruleset(ctx context.Context) (string, error) {
	return ns.Exec(ctx, "", "nft", "list", "ruleset")
}

// nftraceGroup is the netlink multicast group bit of NFNLGRP_NFTRACE (group 9) as
// /proc/net/netlink shows it.
const nftraceGroup = 1 << (9 - 1)

// Trace is a running `nft monitor trace` in a namespace. Only packets that a rule marked
// with `meta nftrace set 1` are traced.
type Trace struct {
	ns   *NS
	cmd  *exec.Cmd
	done chan struct{} // closed when the output is read to its end

	stopOnce sync.Once
	stopErr  error

	mu    sync.Mutex
	lines []string
}

// StartTrace starts `nft monitor trace` in the namespace and returns once the monitor has
// subscribed to trace events, so that no event of later traffic is missed.
func (ns *NS) StartTrace() (*Trace, error) {
	// stdbuf makes nft flush each line although its output is a pipe.
	cmd := exec.Command("stdbuf", "-oL", "nft", "monitor", "trace")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("netns %s: nft monitor trace: %w", ns.name, err)
	}
	if err := ns.Do(cmd.Start); err != nil {
		return nil, fmt.Errorf("netns %s: nft monitor trace: %w", ns.name, err)
	}
	t := &Trace{ns: ns, cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			t.mu.Lock()
			t.lines = append(t.lines, sc.Text())
			t.mu.Unlock()
		}
	}()
	if err := ns.track(t, t.stop); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if ok, err := subscribed(cmd.Process.Pid); err != nil || ok {
			if err == nil {
				return t, nil
			}
			_, serr := t.Stop()
			return nil, fmt.Errorf("netns %s: nft monitor trace: %w (stop: %v)", ns.name, err, serr)
		}
		if time.Now().After(deadline) {
			_, serr := t.Stop()
			return nil, fmt.Errorf("netns %s: nft monitor trace did not subscribe within 5s (stop: %v)", ns.name, serr)
		}
	}
}

// subscribed reports whether a netlink socket in the namespace of process pid listens to
// trace events. /proc/PID/net/netlink lists all netlink sockets of that namespace.
func subscribed(pid int) (bool, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/netlink", pid))
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(data), "\n")[1:] {
		// sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
		f := strings.Fields(line)
		if len(f) < 4 || f[1] != "12" { // NETLINK_NETFILTER
			continue
		}
		groups, err := strconv.ParseUint(f[3], 16, 32)
		if err == nil && groups&nftraceGroup != 0 {
			return true, nil
		}
	}
	return false, nil
}

// Lines returns the trace lines printed so far.
func (t *Trace) Lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.lines...)
}

// Stop ends the monitor and returns every trace line it printed. Events still queued in the
// kernel when Stop is called may be lost; wait for the traffic's answer first. Stop is
// idempotent.
func (t *Trace) Stop() ([]string, error) {
	t.stop()
	t.ns.untrack(t)
	return t.Lines(), t.stopErr
}

func (t *Trace) stop() {
	t.stopOnce.Do(func() {
		_ = t.cmd.Process.Kill()
		<-t.done // read all output before Wait closes the pipe
		err := t.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok && !ee.Exited() {
			err = nil // killed by us
		}
		if err != nil {
			t.stopErr = fmt.Errorf("netns %s: nft monitor trace: %w", t.ns.name, err)
		}
	})
}
