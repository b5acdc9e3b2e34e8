package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// harness runs a Runner's Loop on a fake clock and reports every sync and every
// time the loop blocks.
type harness struct {
	t     *testing.T
	clock *clocktesting.FakeClock
	r     *Runner
	calls chan bool          // full flag of each sync
	waits chan time.Duration // each time the loop blocks
	gate  chan struct{}      // when non-nil, each sync waits for a receive on it
	mu    sync.Mutex
	fail  int // syncs left to fail
}

func newHarness(t *testing.T, cfg Config, gated bool) *harness {
	h := &harness{t: t, clock: clocktesting.NewFakeClock(t0),
		calls: make(chan bool, 100), waits: make(chan time.Duration, 100)}
	if gated {
		h.gate = make(chan struct{})
	}
	cfg.Clock = h.clock
	h.r = New(h.sync, cfg)
	h.r.beforeWait = func(d time.Duration) { h.waits <- d }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.r.Loop(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		if h.gate != nil {
			close(h.gate)
		}
		<-done
	})
	return h
}

func (h *harness) sync(_ context.Context, full bool) error {
	h.calls <- full
	if h.gate != nil {
		<-h.gate
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail > 0 {
		h.fail--
		return errors.New("injected failure")
	}
	return nil
}

func (h *harness) wantCall(full bool) {
	h.t.Helper()
	select {
	case got := <-h.calls:
		if got != full {
			h.t.Fatalf("sync full=%v, want %v", got, full)
		}
	case <-time.After(5 * time.Second):
		h.t.Fatalf("no sync happened")
	}
}

// wantIdle waits until the loop blocks and checks no sync ran meanwhile.
func (h *harness) wantIdle(wait time.Duration) {
	h.t.Helper()
	select {
	case got := <-h.waits:
		if got != wait {
			h.t.Fatalf("loop waits %v, want %v", got, wait)
		}
	case <-time.After(5 * time.Second):
		h.t.Fatalf("loop never blocked")
	}
	select {
	case full := <-h.calls:
		h.t.Fatalf("unexpected sync (full=%v)", full)
	default:
	}
}

func TestLoopCoalescesRequestsMadeDuringASync(t *testing.T) {
	h := newHarness(t, Config{MinInterval: time.Second, Burst: 2, SyncPeriod: time.Minute}, true)
	h.wantIdle(time.Minute)
	h.r.Run()
	h.wantCall(true)
	for range 10 {
		h.r.Run()
	}
	h.gate <- struct{}{} // finish the first sync
	h.wantCall(false)    // the ten requests, as one sync (second token of the burst)
	h.gate <- struct{}{}
	h.wantIdle(time.Minute)
}

func TestLoopSpacesSyncsByMinInterval(t *testing.T) {
	h := newHarness(t, Config{MinInterval: time.Second, Burst: 1, SyncPeriod: time.Minute}, false)
	h.wantIdle(time.Minute)
	h.r.Run()
	h.wantCall(true)
	h.wantIdle(time.Minute)
	h.r.Run()
	h.wantIdle(time.Second)
	h.clock.Step(time.Second)
	h.wantCall(false)
}

func TestLoopPeriodicFullSync(t *testing.T) {
	h := newHarness(t, Config{MinInterval: time.Second, SyncPeriod: 30 * time.Second}, false)
	h.wantIdle(30 * time.Second)
	h.clock.Step(30 * time.Second)
	h.wantCall(true)
	h.wantIdle(30 * time.Second)
	h.clock.Step(10 * time.Second)
	h.r.Run()
	h.wantCall(false)
	h.wantIdle(20 * time.Second)
	h.clock.Step(20 * time.Second)
	h.wantCall(true)
}

func TestLoopRetriesWithBackoff(t *testing.T) {
	h := newHarness(t, Config{SyncPeriod: time.Minute, InitialBackoff: time.Second, MaxBackoff: 4 * time.Second}, false)
	h.mu.Lock()
	h.fail = 4
	h.mu.Unlock()
	h.wantIdle(time.Minute)
	h.r.Run()
	for _, backoff := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		h.wantCall(true)
		h.wantIdle(backoff)
		h.clock.Step(backoff)
	}
	h.wantCall(true) // the fifth attempt succeeds
	h.wantIdle(time.Minute)
}
