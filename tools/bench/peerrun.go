package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
	labcluster "github.com/nftproxy/nftproxy/e2e/cluster"
	"github.com/nftproxy/nftproxy/e2e/lab"
)

// changeTimeout bounds the wait for one change to reach the data path.
const changeTimeout = 2 * time.Minute

// measure runs proxy on the node at min-sync-period minSync and measures it; a failure
// is recorded in the run, whose other figures stand. The node is flushed afterwards.
func (pl *peerLab) measure(ctx context.Context, p *progress, o peerOptions, rng *rand.Rand, n int, proxy, minSync string) *PeerRun {
	run := &PeerRun{N: n, Proxy: proxy, MinSync: minSync}
	if err := pl.start(ctx, proxy, minSync); err != nil {
		run.Error = err.Error()
		return run
	}
	proc := pl.node.ProxyProcess
	t0 := time.Now()
	defer func() {
		if err := pl.stop(context.WithoutCancel(ctx)); err != nil {
			run.Error = strings.TrimSpace(run.Error + "\nflushing the node: " + err.Error())
		}
	}()
	if err := pl.measureRun(ctx, p, o, rng, run, proc, t0); err != nil {
		run.Error = fmt.Sprintf("%v\n%s log:\n%s", err, proxy, proc.Tail(1500))
		p.printf("FAILED: %v", err)
	}
	return run
}

// measureRun takes the figures of run, whose proxy proc started at t0.
func (pl *peerLab) measureRun(ctx context.Context, p *progress, o peerOptions, rng *rand.Rand, run *PeerRun, proc *apiserver.Process, t0 time.Time) error {
	pid := proc.Cmd.Process.Pid
	want := pl.backends[pl.cur].Spec.Name
	if err := pl.waitReach(ctx, proc, want, t0, o.timeout); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	run.ProgrammedS = time.Since(t0).Seconds()
	var err error
	if run.ProgrammedCPU, err = readProcCPU(pid); err != nil {
		return err
	}
	if run.RSSProgrammedMB, err = readPeakRSS(pid); err != nil {
		return err
	}
	p.printf("programmed in %.2f s, peak RSS %.0f MB", run.ProgrammedS, run.RSSProgrammedMB)

	var lat []float64
	for range o.changes {
		t, err := pl.change(ctx, proc)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			run.Missed++
			p.printf("change missed: %v", err)
			continue
		}
		lat = append(lat, ms64(t))
		// Let the proxy finish the sync that carried the change before the next one.
		sleepCtx(ctx, 300*time.Millisecond)
	}
	run.LatencyMs, run.LatenciesMs = summarize(lat), lat
	p.printf("change -> reached: p50 %s, p99 %s (%d changes, %d missed)", fmtMs(run.LatencyMs.P50), fmtMs(run.LatencyMs.P99), len(lat), run.Missed)

	if err := pl.cpuChanges(ctx, o, rng, run, proc); err != nil {
		return err
	}
	if run.RSSEndMB, err = readPeakRSS(pid); err != nil {
		return err
	}
	p.printf("%d changes at %.0f/s: %.2f s CPU (%.2f own + %.2f children) in %.1f s; peak RSS %.0f MB", run.Changes, run.ChangeRate,
		run.CPU.Total(), run.CPU.Self, run.CPU.Children, run.ChangesWallS, run.RSSEndMB)

	c0, err := readProcCPU(pid)
	if err != nil {
		return err
	}
	t := time.Now()
	sleepCtx(ctx, o.idle)
	c1, err := readProcCPU(pid)
	if err != nil {
		return err
	}
	run.IdleCPU, run.IdleS = c1.sub(c0), time.Since(t).Seconds()
	p.printf("idle: %.2f s CPU in %.0f s", run.IdleCPU.Total(), run.IdleS)
	return ctx.Err()
}

// cpuChanges offers o.cpuChanges endpoint changes to random Services at o.changeRate,
// then one to the probe Service, and records the proxy's CPU until that one reaches the
// data path (when every change before it has been applied too).
func (pl *peerLab) cpuChanges(ctx context.Context, o peerOptions, rng *rand.Rand, run *PeerRun, proc *apiserver.Process) error {
	pid := proc.Cmd.Process.Pid
	c0, err := readProcCPU(pid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	interval := time.Duration(float64(time.Second) / o.changeRate)
	for k := range o.cpuChanges {
		sleepUntil(ctx, t0.Add(time.Duration(k)*interval))
		if err := pl.objs.toggle(ctx, rng.IntN(len(pl.objs.slices))); err != nil {
			return err
		}
	}
	if _, err := pl.change(ctx, proc); err != nil {
		return fmt.Errorf("after %d changes: %w", o.cpuChanges, err)
	}
	c1, err := readProcCPU(pid)
	if err != nil {
		return err
	}
	run.Changes, run.ChangeRate = o.cpuChanges+1, o.changeRate
	run.CPU, run.ChangesWallS = c1.sub(c0), time.Since(t0).Seconds()
	return nil
}

// change points the probe Service at the next backend and returns the time from the API
// write to the first new connection that reaches it.
func (pl *peerLab) change(ctx context.Context, proc *apiserver.Process) (time.Duration, error) {
	t0 := time.Now()
	want, err := pl.moveProbe(ctx)
	if err != nil {
		return 0, err
	}
	if err := pl.waitReach(ctx, proc, want, t0, changeTimeout); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// waitReach connects from the client pod to the probe Service until a connection reaches
// backend want, or timeout after t0 passes, or proc exits.
func (pl *peerLab) waitReach(ctx context.Context, proc *apiserver.Process, want string, t0 time.Time, timeout time.Duration) error {
	var last string
	for i := 0; ; i++ {
		r, err := pl.client.Echo(lab.Request{Proto: lab.TCP, Dst: pl.probeDst, Timeout: 100 * time.Millisecond})
		switch {
		case err == nil && r.Pod == want:
			return nil
		case err == nil:
			last = "answered by " + r.Pod
		default:
			last = err.Error()
		}
		if proc.Exited() {
			return fmt.Errorf("%s exited", proc.Name)
		}
		if time.Since(t0) > timeout {
			return fmt.Errorf("no connection to %s reached %s within %v (last: %s)", pl.probeDst, want, timeout, last)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Poll tightly at first: the change may be applied within a millisecond or two.
		if time.Since(t0) > 2*time.Second {
			time.Sleep(5 * time.Millisecond)
		} else {
			time.Sleep(500 * time.Microsecond)
		}
	}
}

// start starts proxy on the node, kube-proxy's iptables mode with pl.legacyBin first
// in its PATH when set.
func (pl *peerLab) start(ctx context.Context, proxy, minSync string) error {
	if proxy == string(labcluster.KubeProxyIptables) && pl.legacyBin != "" {
		// The child inherits the environment at its start; nothing else starts meanwhile.
		path := os.Getenv("PATH")
		os.Setenv("PATH", pl.legacyBin+":"+path)
		defer os.Setenv("PATH", path)
	}
	return pl.c.StartProxy(ctx, pl.node, labcluster.Proxy(proxy), proxyFlags(proxy, minSync)...)
}

// stop stops the node's proxy and removes what it programmed, iptables-legacy's chains
// included.
func (pl *peerLab) stop(ctx context.Context) error {
	err := pl.c.StopProxy(ctx, pl.node)
	if pl.legacyBin == "" {
		return err
	}
	errs := []error{err}
	for _, cmd := range []string{"iptables-legacy", "ip6tables-legacy"} {
		for _, table := range []string{"filter", "nat", "mangle"} {
			for _, op := range []string{"-F", "-X"} {
				if _, err := pl.node.Exec(ctx, "", cmd, "-t", table, op); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// sleepUntil sleeps until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) {
	if d := time.Until(t); d > 0 {
		sleepCtx(ctx, d)
	}
}
