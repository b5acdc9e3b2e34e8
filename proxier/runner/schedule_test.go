package runner

import (
	"errors"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testConfig() Config {
	return Config{MinInterval: time.Second, Burst: 2, SyncPeriod: 30 * time.Second,
		InitialBackoff: time.Second, MaxBackoff: 8 * time.Second}.withDefaults()
}

// step runs next at now and, when it says to run, finishes the sync at once with err.
func step(t *testing.T, s *schedule, now time.Time, err error) (ran, full bool, wait time.Duration) {
	t.Helper()
	ran, full, wait = s.next(now)
	if ran {
		s.finished(now, now, full, err)
	}
	return ran, full, wait
}

func TestScheduleCoalescesRequests(t *testing.T) {
	s := newSchedule(testConfig(), t0)
	for range 5 {
		s.request()
	}
	if ran, full, _ := step(t, s, t0, nil); !ran || !full {
		t.Fatalf("first sync: ran=%v full=%v, want a full sync", ran, full)
	}
	if ran, _, wait := step(t, s, t0, nil); ran {
		t.Fatalf("five requests ran more than one sync")
	} else if wait != 30*time.Second {
		t.Errorf("idle wait = %v, want the 30s until the periodic sync", wait)
	}
}

func TestScheduleMinIntervalAfterBurst(t *testing.T) {
	s := newSchedule(testConfig(), t0)
	for i := range 2 {
		s.request()
		if ran, full, _ := step(t, s, t0, nil); !ran || full != (i == 0) {
			t.Fatalf("burst sync %d: ran=%v full=%v", i, ran, full)
		}
	}
	s.request()
	ran, _, wait := step(t, s, t0.Add(300*time.Millisecond), nil)
	if ran {
		t.Fatalf("third sync ran inside the burst's min interval")
	}
	if wait != 700*time.Millisecond {
		t.Errorf("wait = %v, want 700ms (one token per 1s)", wait)
	}
	if ran, full, _ := step(t, s, t0.Add(time.Second), nil); !ran || full {
		t.Fatalf("sync after min interval: ran=%v full=%v, want a partial sync", ran, full)
	}
	// A long idle time refills the bucket only up to the burst.
	now := t0.Add(20 * time.Second)
	for i := range 3 {
		s.request()
		ran, _, _ := step(t, s, now, nil)
		if want := i < 2; ran != want {
			t.Fatalf("after idling, sync %d ran=%v, want %v", i, ran, want)
		}
	}
}

func TestSchedulePeriodicFullSync(t *testing.T) {
	s := newSchedule(testConfig(), t0)
	s.request()
	step(t, s, t0, nil) // the first, full, sync
	// Partial syncs do not postpone the periodic full sync.
	for _, at := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second} {
		s.request()
		if ran, full, _ := step(t, s, t0.Add(at), nil); !ran || full {
			t.Fatalf("sync at +%v: ran=%v full=%v, want partial", at, ran, full)
		}
	}
	if ran, _, wait := step(t, s, t0.Add(25*time.Second), nil); ran || wait != 5*time.Second {
		t.Fatalf("at +25s: ran=%v wait=%v, want no sync and 5s wait", ran, wait)
	}
	if ran, full, _ := step(t, s, t0.Add(30*time.Second), nil); !ran || !full {
		t.Fatalf("at +30s: ran=%v full=%v, want the periodic full sync", ran, full)
	}
	if ran, _, wait := step(t, s, t0.Add(31*time.Second), nil); ran || wait != 29*time.Second {
		t.Fatalf("at +31s: ran=%v wait=%v, want next periodic sync in 29s", ran, wait)
	}
}

func TestScheduleBackoff(t *testing.T) {
	cfg := testConfig()
	cfg.MinInterval = 0
	s := newSchedule(cfg, t0)
	fail := errors.New("nft: boom")
	s.request()
	now := t0
	wantWaits := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second}
	for i, want := range wantWaits {
		ran, full, _ := step(t, s, now, fail)
		if !ran || !full {
			t.Fatalf("attempt %d: ran=%v full=%v, want a (full) retry", i, ran, full)
		}
		// A new request during backoff does not cut the wait short.
		s.request()
		ran, _, wait := step(t, s, now.Add(want/2), nil)
		if ran || wait != want-want/2 {
			t.Fatalf("attempt %d: during backoff ran=%v wait=%v, want to wait %v more", i, ran, wait, want-want/2)
		}
		now = now.Add(want)
	}
	if ran, _, _ := step(t, s, now, nil); !ran {
		t.Fatalf("retry after the capped backoff did not run")
	}
	// Success resets the backoff.
	s.request()
	step(t, s, now, fail)
	if _, _, wait := s.next(now); wait != time.Second {
		t.Errorf("backoff after a success = %v, want the initial 1s", wait)
	}
}

func TestDefaultsCapBackoffAtSyncPeriod(t *testing.T) {
	c := Config{SyncPeriod: 10 * time.Second}.withDefaults()
	if c.MaxBackoff != 10*time.Second || c.Burst != DefaultBurst || c.InitialBackoff != DefaultInitialBackoff {
		t.Errorf("defaults = %+v", c)
	}
}
