package runner

import "time"

// schedule decides when the next sync runs. It is plain state driven by explicit
// times, so its rules are tested without goroutines.
type schedule struct {
	cfg Config

	// pending is true when a sync has been requested and not yet run.
	pending bool
	// full is true when the next sync must be a full one.
	full bool

	// credit is the token bucket that spaces syncs by MinInterval with a burst,
	// kept as time so the arithmetic is exact: it grows with elapsed time up to
	// Burst×MinInterval and each sync costs MinInterval. refilled is when it was
	// last topped up.
	credit   time.Duration
	refilled time.Time

	// nextFull is when the periodic full sync is due.
	nextFull time.Time
	// retryAt is when a failed sync may be retried; zero when not backing off.
	retryAt time.Time
	// backoff is the wait applied after the last failure (zero after a success).
	backoff time.Duration
}

func newSchedule(cfg Config, now time.Time) *schedule {
	s := &schedule{cfg: cfg, full: true, credit: time.Duration(cfg.Burst) * cfg.MinInterval, refilled: now}
	if cfg.SyncPeriod > 0 {
		s.nextFull = now.Add(cfg.SyncPeriod)
	}
	return s
}

// request records that a sync is wanted.
func (s *schedule) request() { s.pending = true }

// next says whether a sync should run at now, and whether it is a full one. When
// none should run, wait is how long until the schedule may change by itself.
func (s *schedule) next(now time.Time) (run, full bool, wait time.Duration) {
	if s.cfg.SyncPeriod > 0 && !now.Before(s.nextFull) {
		s.pending, s.full = true, true
	}
	if !s.pending {
		return false, false, s.untilPeriodic(now)
	}
	if !s.retryAt.IsZero() {
		if now.Before(s.retryAt) {
			return false, false, s.retryAt.Sub(now)
		}
		s.retryAt = time.Time{}
	}
	if wait := s.take(now); wait > 0 {
		return false, false, wait
	}
	full = s.full
	s.pending, s.full = false, false
	return true, full, 0
}

// finished records the outcome of a sync that started at start and ended at end.
func (s *schedule) finished(start, end time.Time, full bool, err error) {
	if err == nil {
		s.backoff, s.retryAt = 0, time.Time{}
		if full && s.cfg.SyncPeriod > 0 {
			s.nextFull = start.Add(s.cfg.SyncPeriod)
		}
		return
	}
	s.pending = true
	s.full = s.full || full
	if s.backoff == 0 {
		s.backoff = s.cfg.InitialBackoff
	} else {
		s.backoff = min(2*s.backoff, s.cfg.MaxBackoff)
	}
	s.retryAt = end.Add(s.backoff)
}

// take takes a token from the bucket and returns 0, or returns how long until a
// token is available.
func (s *schedule) take(now time.Time) time.Duration {
	if s.cfg.MinInterval <= 0 {
		return 0
	}
	if elapsed := now.Sub(s.refilled); elapsed > 0 {
		s.credit = min(time.Duration(s.cfg.Burst)*s.cfg.MinInterval, s.credit+elapsed)
		s.refilled = now
	}
	if s.credit >= s.cfg.MinInterval {
		s.credit -= s.cfg.MinInterval
		return 0
	}
	return s.cfg.MinInterval - s.credit
}

// untilPeriodic is the wait until the periodic full sync, or a long wait (Loop
// wakes up anyway on a request) when periodic syncs are off.
func (s *schedule) untilPeriodic(now time.Time) time.Duration {
	if s.cfg.SyncPeriod <= 0 {
		return time.Hour
	}
	return s.nextFull.Sub(now)
}
