package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// The iptables backends the baseline can load with.
const (
	backendLegacy = "legacy"
	backendNFT    = "nft"
)

// restoreBinary returns the iptables-restore of a backend.
func restoreBinary(backend string) string {
	if backend == backendNFT {
		return "iptables-nft-restore"
	}
	return "iptables-legacy-restore"
}

// iptablesVersion returns `iptables-restore --version` of a backend, or why not.
func iptablesVersion(backend string) string {
	out, err := exec.Command(restoreBinary(backend), "--version").CombinedOutput()
	if err != nil {
		return "unavailable: " + err.Error()
	}
	return strings.TrimSpace(string(out))
}

// BaselineResult is the control-plane measurement of upstream kube-proxy's
// iptables mode at one N, in a fresh namespace.
type BaselineResult struct {
	N       int    `json:"n"`
	Backend string `json:"backend"`
	// Rules and Chains count the restore input of a full sync; TextMB is its size.
	Rules  int     `json:"rules"`
	Chains int     `json:"chains"`
	TextMB float64 `json:"text_mb"`
	// Full is the first sync: generating the text and `iptables-restore --noflush`.
	Full BaselineSample `json:"full_sync"`
	// Updates rewrite the whole ruleset (kube-proxy's full sync, which it also did
	// on every change before MinimizeIPTablesRestore).
	Updates []BaselineSample `json:"updates"`
	Update  Summary          `json:"update_ms"`
	// PartialUpdates are kube-proxy >= 1.27 partial syncs: KUBE-SERVICES,
	// KUBE-NODEPORTS and the filter chains whole, plus the changed Service's chains.
	PartialUpdates []BaselineSample `json:"partial_updates"`
	PartialUpdate  Summary          `json:"partial_update_ms"`
	// Note says what was cut short (a timeout, the time budget).
	Note string `json:"note,omitempty"`
}

// BaselineSample is one iptables-restore.
type BaselineSample struct {
	GenMs     float64 `json:"generate_ms"`
	RestoreMs float64 `json:"restore_ms"`
	TotalMs   float64 `json:"total_ms"`
}

// baselineOptions configures a baseline measurement.
type baselineOptions struct {
	N       int
	Backend string
	Updates int
	Seed    uint64
	// Budget bounds the time spent on updates (at least 2 of each kind are made).
	Budget time.Duration
	// Timeout bounds any one restore; past it the measurement stops with a note.
	Timeout time.Duration
	// Target adds the data-plane target Service (last in KUBE-SERVICES).
	Target func(c *cluster)
}

// measureBaseline loads kube-proxy's ruleset for the cluster into ns and updates it.
func measureBaseline(ctx context.Context, p *progress, ns *lab.NS, o baselineOptions) (*BaselineResult, error) {
	c := newCluster(o.N)
	if o.Target != nil {
		o.Target(c)
	}
	k := newKubeProxy(c.state)
	res := &BaselineResult{N: o.N, Backend: o.Backend}
	bin := restoreBinary(o.Backend)
	if _, err := ns.Exec(ctx, kubeSetup, bin); err != nil {
		return nil, fmt.Errorf("baseline N=%d: kube-proxy's base chains: %w", o.N, err)
	}
	restore := func(what string, text restoreText) (time.Duration, error) {
		rctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		var took time.Duration
		err := p.during(fmt.Sprintf("%s: %s --noflush (%d rules, %.0f MB)", what, bin, text.rules, float64(text.buf.Len())/(1<<20)), 15*time.Second, func() error {
			t0 := time.Now()
			_, err := ns.Exec(rctx, text.buf.String(), bin, "--noflush")
			took = time.Since(t0)
			return err
		})
		if err != nil && rctx.Err() != nil && ctx.Err() == nil {
			return took, fmt.Errorf("%w after %s", errTimeout, o.Timeout)
		}
		return took, err
	}

	t0 := time.Now()
	full := k.restore(nil, nil)
	gen := time.Since(t0)
	res.Rules, res.Chains, res.TextMB = full.rules, full.chains, float64(full.buf.Len())/(1<<20)
	took, err := restore("full sync", full)
	if err != nil {
		if errors.Is(err, errTimeout) {
			res.Note = fmt.Sprintf("full sync did not finish within %s", o.Timeout)
			res.Full = BaselineSample{GenMs: ms64(gen), RestoreMs: -1, TotalMs: -1}
			return res, nil
		}
		return nil, fmt.Errorf("baseline N=%d: full sync: %w", o.N, err)
	}
	res.Full = BaselineSample{GenMs: ms64(gen), RestoreMs: ms64(took), TotalMs: ms64(gen + took)}
	p.printf("full sync: %.2fs (generate %.2fs, restore %.2fs)", res.Full.TotalMs/1e3, gen.Seconds(), took.Seconds())

	// The same Services change as in our measurement (same seed), by pairs.
	rng := rand.New(rand.NewPCG(o.Seed, uint64(o.N)))
	var svc int
	deadline := time.Now().Add(o.Budget)
	for _, partial := range []bool{false, true} {
		samples := &res.Updates
		if partial {
			samples = &res.PartialUpdates
		}
		for u := 0; u < o.Updates; u++ {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if u >= 2 && time.Now().After(deadline) {
				res.Note = appendNote(res.Note, fmt.Sprintf("%s updates cut to %d by the %s budget", updateKind(partial), u, o.Budget))
				break
			}
			if u%2 == 0 {
				svc = c.randomService(rng)
			}
			name := c.names[svc]
			before := k.chainsOf(name)
			c.toggleEndpoint(svc)
			t0 := time.Now()
			var text restoreText
			if partial {
				text = k.restore(map[state.ServiceName]bool{name: true}, stale(before, k.chainsOf(name)))
			} else {
				text = k.restore(nil, nil)
			}
			gen := time.Since(t0)
			kind := updateKind(partial)
			took, err := restore(fmt.Sprintf("%s update %d", kind, u+1), text)
			if err != nil {
				if errors.Is(err, errTimeout) {
					res.Note = appendNote(res.Note, fmt.Sprintf("a %s update did not finish within %s", kind, o.Timeout))
					break
				}
				return nil, fmt.Errorf("baseline N=%d: %s update of %s: %w", o.N, kind, name, err)
			}
			*samples = append(*samples, BaselineSample{GenMs: ms64(gen), RestoreMs: ms64(took), TotalMs: ms64(gen + took)})
		}
		if partial {
			// Budget the partial updates afresh: they are the cheaper kind.
			continue
		}
		deadline = time.Now().Add(o.Budget)
	}
	res.Update = summarize(totals(res.Updates))
	res.PartialUpdate = summarize(totals(res.PartialUpdates))
	p.printf("updates: full-table p50 %.0f ms (%d), partial p50 %.0f ms (%d)",
		res.Update.P50, res.Update.N, res.PartialUpdate.P50, res.PartialUpdate.N)
	return res, nil
}

var errTimeout = errors.New("timed out")

func updateKind(partial bool) string {
	if partial {
		return "partial"
	}
	return "full-table"
}

func appendNote(note, more string) string {
	if note == "" {
		return more
	}
	return note + "; " + more
}

func totals(s []BaselineSample) []float64 {
	var out []float64
	for _, x := range s {
		out = append(out, x.TotalMs)
	}
	return out
}

// stale returns the chains in before that are not in after, which a partial sync
// deletes.
func stale(before, after []string) []string {
	var out []string
	for _, c := range before {
		if !slices.Contains(after, c) {
			out = append(out, c)
		}
	}
	return out
}
