package main

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progress prints what the bench is doing, with the time elapsed since the start,
// so that a long run shows where it is.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
	phase string
}

func newProgress(w io.Writer) *progress { return &progress{w: w, start: time.Now()} }

// setPhase names the phase later lines belong to ("control N=10000").
func (p *progress) setPhase(format string, args ...any) {
	p.mu.Lock()
	p.phase = fmt.Sprintf(format, args...)
	p.mu.Unlock()
	p.printf("start")
}

// printf prints one line: "[  12.3s] phase: message".
func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%7.1fs] %s: %s\n", time.Since(p.start).Seconds(), p.phase, fmt.Sprintf(format, args...))
}

// during runs fn and, while it runs, prints "what ... still running, Ns" every
// interval, for steps that take long (a 50k-Service iptables-restore). Quick steps
// print nothing.
func (p *progress) during(what string, interval time.Duration, fn func() error) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				p.printf("%s ... still running, %.0fs", what, time.Since(t0).Seconds())
			}
		}
	}()
	err := fn()
	close(done)
	wg.Wait()
	return err
}
