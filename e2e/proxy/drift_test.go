package proxy_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// resyncPeriod is the period of the full resync in the drift suite, as the daemon's runner
// would be configured.
const resyncPeriod = time.Second

// resyncer runs a full sync every period, as the daemon's runner does between event-driven
// syncs. Hold mu to keep a resync from running meanwhile.
type resyncer struct {
	mu   sync.Mutex
	p    *nodeProxy
	stop chan struct{}
	done chan struct{}

	// starts are the times the full syncs started; errs their errors.
	starts []time.Time
	errs   []error
}

// startResync starts full syncs every period; Stop ends them.
func startResync(ctx context.Context, p *nodeProxy, period time.Duration) *resyncer {
	r := &resyncer{p: p, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
			r.mu.Lock()
			r.starts = append(r.starts, time.Now())
			_, err := p.FullSync(ctx)
			if err != nil {
				r.errs = append(r.errs, err)
			}
			r.mu.Unlock()
		}
	}()
	return r
}

// Stop ends the resyncs and returns their errors.
func (r *resyncer) Stop() []error {
	close(r.stop)
	<-r.done
	return r.errs
}

// firstSyncAfter returns the start of the first full sync that started after t.
func (r *resyncer) firstSyncAfter(t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.IndexFunc(r.starts, func(s time.Time) bool { return s.After(t) })
	if i < 0 {
		return time.Time{}, false
	}
	return r.starts[i], true
}

// probeInterval is how often the drift suite checks whether traffic works again.
const probeInterval = 5 * time.Millisecond

var _ = Describe("Drift", Label("kernel"), func() {
	It("is repaired by the next periodic full sync after an outsider flushes the ruleset", func(ctx SpecContext) {
		l := newLab(topology())
		p := startProxy(ctx, l, withoutMirror())
		nodePort := tcp(nodePortOf(false, nodePortWeb))
		xs := exchanges(l.Client, nodePort, 20, 1)
		answered("external -> NodePort before the flush", xs)

		r := startResync(ctx, p, resyncPeriod)
		stopped := false
		DeferCleanup(func() {
			if !stopped {
				r.Stop()
			}
		})
		rng := rand.New(rand.NewPCG(3, 4))
		var recoveries []time.Duration
		const trials = 3
		for trial := range trials + 1 {
			if trial < trials {
				// Flush at a random point of the resync period.
				time.Sleep(time.Duration(rng.Int64N(int64(resyncPeriod))))
			} else {
				// The worst case: flush right after a full sync.
				r.mu.Lock()
				n := len(r.starts)
				r.mu.Unlock()
				Eventually(func() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.starts) }).
					WithTimeout(2 * resyncPeriod).WithPolling(time.Millisecond).Should(BeNumerically(">", n))
			}
			var flushed time.Time
			func() {
				r.mu.Lock() // no resync between the flush and the check that it broke traffic
				defer r.mu.Unlock()
				_, err := l.Node.Exec(ctx, "", "nft", "flush", "ruleset")
				flushed = time.Now()
				Expect(err).NotTo(HaveOccurred())
				// The node port is gone at once: the node's own stack refuses the port.
				_, err = l.Client.Echo(lab.Request{Proto: lab.TCP, Dst: nodePort.Dst, Timeout: dropTimeout})
				Expect(err).To(MatchError(lab.ErrRefused), "trial %d: the flush must break the node port", trial)
				Expect(l.Node.Ruleset(ctx)).NotTo(ContainSubstring("nftproxy"), "trial %d: the flush must remove the tables", trial)
			}()

			// Probe until the node port answers again.
			var recovered time.Time
			attempts := 0
			for deadline := flushed.Add(resyncPeriod + 2*time.Second); time.Now().Before(deadline); time.Sleep(probeInterval) {
				attempts++
				if _, err := l.Client.Echo(lab.Request{Proto: lab.TCP, Dst: nodePort.Dst, Timeout: 200 * time.Millisecond}); err == nil {
					recovered = time.Now()
					break
				}
			}
			countConnections(attempts)
			Expect(recovered).NotTo(BeZero(), "trial %d: no answer within %v of the flush, with full syncs every %v", trial, resyncPeriod+2*time.Second, resyncPeriod)
			took := recovered.Sub(flushed)
			recoveries = append(recoveries, took)
			synced, ok := r.firstSyncAfter(flushed)
			Expect(ok).To(BeTrue())
			Expect(recovered).To(BeTemporally(">", synced), "trial %d: traffic came back before any resync started", trial)
			Expect(took).To(BeNumerically("<=", resyncPeriod+time.Second), "trial %d: recovery took longer than a period", trial)

			// Everything is back, not just the node port.
			answered("pod -> ClusterIP after the resync", exchanges(l.Pod(podC).NS, tcp(cipWeb), 20, 2))
			answered("pod -> ClusterIP, IPv6, after the resync", exchanges(l.Pod(podC).NS, tcp(cipWeb6), 20, 2))
			expectRefused(l.Pod(podC).NS, tcp(cipEmpty))
		}
		stopped = true
		Expect(r.Stop()).To(BeEmpty(), "full syncs failed")

		var parts []string
		for _, d := range recoveries[:trials] {
			parts = append(parts, d.Round(time.Millisecond).String())
		}
		report("drift: `nft flush ruleset` with a full resync every %v: traffic back after %s (flushes at random points of the period), %v (flush right after a resync, the worst case)",
			resyncPeriod, strings.Join(parts, ", "), recoveries[trials].Round(time.Millisecond))
	})
})
