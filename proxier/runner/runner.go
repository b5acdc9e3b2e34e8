// Package runner runs the proxier's sync function at a bounded frequency: requests
// are coalesced, syncs are spaced by a minimum interval (with a small burst), a full
// sync runs every sync period to repair drift, and failed syncs retry with backoff.
package runner

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// Func performs one sync. full is true when the sync must rewrite everything it owns
// rather than apply only what changed (the first sync, the periodic sync, and retries
// of a failed full sync).
type Func func(ctx context.Context, full bool) error

// Defaults for the zero fields of Config.
const (
	DefaultBurst          = 2
	DefaultInitialBackoff = time.Second
	DefaultMaxBackoff     = 30 * time.Second
)

// Config sets the pace of a Runner.
type Config struct {
	// MinInterval is the least time between two syncs once the burst is used up
	// (kube-proxy's --min-sync-period). Zero means no limit.
	MinInterval time.Duration
	// Burst is how many syncs may run back to back before MinInterval applies
	// (default DefaultBurst).
	Burst int
	// SyncPeriod is the time between full syncs (kube-proxy's --sync-period): a full
	// sync is requested when SyncPeriod has passed since the last successful full
	// sync, however many partial syncs ran meanwhile. Zero disables periodic syncs.
	SyncPeriod time.Duration
	// InitialBackoff is the wait before retrying a failed sync; it doubles with each
	// consecutive failure up to MaxBackoff (defaults DefaultInitialBackoff and
	// DefaultMaxBackoff, or SyncPeriod when that is shorter).
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// Clock is the time source (default the real clock).
	Clock clock.WithTicker
}

func (c Config) withDefaults() Config {
	if c.Burst <= 0 {
		c.Burst = DefaultBurst
	}
	if c.InitialBackoff <= 0 {
		c.InitialBackoff = DefaultInitialBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
		if c.SyncPeriod > 0 && c.SyncPeriod < c.MaxBackoff {
			c.MaxBackoff = c.SyncPeriod
		}
	}
	if c.MaxBackoff < c.InitialBackoff {
		c.MaxBackoff = c.InitialBackoff
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return c
}

// Runner calls a Func when asked to, at a bounded frequency. Run may be called from
// any goroutine; Loop runs the Func on the goroutine that calls it.
type Runner struct {
	fn       Func
	clock    clock.WithTicker
	requests chan struct{}
	sched    *schedule
	// beforeWait, when set (by tests), is called each time Loop is about to block,
	// with the time until its next timer.
	beforeWait func(wait time.Duration)
}

// New returns a Runner for fn. Nothing runs until Loop is called.
func New(fn Func, cfg Config) *Runner {
	cfg = cfg.withDefaults()
	return &Runner{
		fn:       fn,
		clock:    cfg.Clock,
		requests: make(chan struct{}, 1),
		sched:    newSchedule(cfg, cfg.Clock.Now()),
	}
}

// Run requests a sync. It never blocks: requests made while a sync is pending or
// running are coalesced into the next sync.
func (r *Runner) Run() {
	select {
	case r.requests <- struct{}{}:
	default:
	}
}

// Loop runs syncs as requested until ctx is done. The first sync is a full one.
func (r *Runner) Loop(ctx context.Context) {
	for {
		run, full, wait := r.sched.next(r.clock.Now())
		if run {
			start := r.clock.Now()
			err := r.fn(ctx, full)
			r.sched.finished(start, r.clock.Now(), full, err)
			continue
		}
		timer := r.clock.NewTimer(wait)
		if r.beforeWait != nil {
			r.beforeWait(wait)
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-r.requests:
			r.sched.request()
		case <-timer.C():
		}
		timer.Stop()
	}
}
