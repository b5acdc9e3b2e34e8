package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// PeerResults is what the peer phase measured: the real kube-proxy and nftproxy, one
// after another on the same node, over the same objects of a real API server.
type PeerResults struct {
	// Machine is the CPU model; the figures belong to it.
	Machine string `json:"machine"`
	// Iptables is the iptables kube-proxy's iptables mode ran ("legacy" or "nft").
	Iptables string `json:"iptables"`
	// Creates says how long writing the objects of each N took.
	Creates []PeerCreate `json:"creates"`
	Runs    []*PeerRun   `json:"runs"`
}

// PeerCreate is the writing of one N's objects through the API server, on top of the
// previous N's.
type PeerCreate struct {
	N         int     `json:"n"`
	Services  int     `json:"services_created"`
	Endpoints int     `json:"endpoints_created"`
	Seconds   float64 `json:"seconds"`
}

// PeerRun is one proxy measured at one N and min-sync-period.
type PeerRun struct {
	N       int    `json:"n"`
	Proxy   string `json:"proxy"`
	MinSync string `json:"min_sync_period"`
	// ProgrammedS is from the proxy's start to the first connection through the probe
	// Service, created after all the others.
	ProgrammedS float64 `json:"programmed_s"`
	// ProgrammedCPU is the proxy's CPU from its start until programmed.
	ProgrammedCPU procCPU `json:"programmed_cpu_s"`
	// LatencyMs is each change's time from the API write to the first new connection
	// that reaches the new backend pod; Missed counts changes not seen within the timeout.
	LatencyMs Summary `json:"latency_ms"`
	// LatenciesMs are the changes' latencies in order: the first follows the start.
	LatenciesMs []float64 `json:"latencies_ms"`
	Missed      int       `json:"latency_missed"`
	// CPU is the proxy's CPU (own and its waited-for children's, /proc/PID/stat) over
	// Changes endpoint changes offered at ChangeRate per second, until the last is applied.
	Changes      int     `json:"changes"`
	ChangeRate   float64 `json:"change_rate"`
	ChangesWallS float64 `json:"changes_wall_s"`
	CPU          procCPU `json:"cpu_s"`
	// RSSProgrammedMB and RSSEndMB are VmHWM of the proxy process when programmed and
	// after all the changes.
	RSSProgrammedMB float64 `json:"rss_programmed_mb"`
	RSSEndMB        float64 `json:"rss_end_mb"`
	// IdleCPU is the proxy's CPU over IdleS seconds without changes.
	IdleCPU procCPU `json:"idle_cpu_s"`
	IdleS   float64 `json:"idle_s"`
	Error   string  `json:"error,omitempty"`
}

// per100 is the run's CPU seconds per 100 changes.
func (r *PeerRun) per100() float64 {
	if r.Changes == 0 {
		return 0
	}
	return r.CPU.Total() * 100 / float64(r.Changes)
}

// Display names of the proxies, in the tables' column order.
var peerProxyNames = []struct{ id, title string }{
	{"kube-proxy-nftables", "kube-proxy nftables"},
	{"kube-proxy-iptables", "kube-proxy iptables"},
	{"nftproxy", "nftproxy"},
}

func peerTitle(id string) string {
	for _, p := range peerProxyNames {
		if p.id == id {
			return p.title
		}
	}
	return id
}

// peerMarkdown renders the peer phase: one table per min-sync-period, rows the metrics,
// columns every proxy at every N.
func (pr *PeerResults) markdown() string {
	if pr == nil || len(pr.Runs) == 0 {
		return ""
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("## Beside the real kube-proxy (peer phase)")
	w("")
	var creates []string
	for _, c := range pr.Creates {
		creates = append(creates, fmt.Sprintf("%s: %d Services and %d endpoints in %.1f s", short(c.N), c.Services, c.Endpoints, c.Seconds))
	}
	w("%s. One real kube-apiserver; N ClusterIP Services x 5 endpoints written through it (Services, and EndpointSlices written directly): %s. Proxies one at a time on the same node namespace (flushed between runs); kube-proxy iptables mode on iptables-%s.",
		cmp.Or(pr.Machine, "unknown CPU"), strings.Join(creates, "; "), pr.Iptables)
	w("")
	var syncs []string
	for _, r := range pr.Runs {
		if !slices.Contains(syncs, r.MinSync) {
			syncs = append(syncs, r.MinSync)
		}
	}
	for _, s := range syncs {
		w("min-sync-period %s:", s)
		w("")
		b.WriteString(peerTable(pr.Runs, s))
		w("")
	}
	for _, r := range pr.Runs {
		if r.Error != "" {
			w("- %s N=%s min-sync-period %s: %s", peerTitle(r.Proxy), short(r.N), r.MinSync, r.Error)
		}
	}
	return b.String()
}

// peerTable renders the runs at min-sync-period minSync as a table: rows the metrics,
// columns every proxy at every N.
func peerTable(runs []*PeerRun, minSync string) string {
	var cols []*PeerRun
	for _, r := range runs {
		if r.MinSync == minSync {
			cols = append(cols, r)
		}
	}
	slices.SortStableFunc(cols, func(a, b *PeerRun) int {
		if a.N != b.N {
			return a.N - b.N
		}
		return peerOrder(a.Proxy) - peerOrder(b.Proxy)
	})
	var b strings.Builder
	row := func(name string, cell func(r *PeerRun) string) {
		b.WriteString("| " + name + " |")
		for _, r := range cols {
			b.WriteString(" " + cell(r) + " |")
		}
		b.WriteString("\n")
	}
	row("", func(r *PeerRun) string { return fmt.Sprintf("%s %s", peerTitle(r.Proxy), short(r.N)) })
	b.WriteString("|---|" + strings.Repeat("---:|", len(cols)) + "\n")
	row("start → programmed", func(r *PeerRun) string { return ifMeasured(r.ProgrammedS > 0, fmtMs(r.ProgrammedS*1e3)) })
	row("CPU until programmed (own + nft/iptables)", func(r *PeerRun) string {
		return ifMeasured(r.ProgrammedS > 0, fmt.Sprintf("%.1f s (%.1f + %.1f)", r.ProgrammedCPU.Total(), r.ProgrammedCPU.Self, r.ProgrammedCPU.Children))
	})
	row("change → reached, p50 / p99", func(r *PeerRun) string {
		s := ifMeasured(r.LatencyMs.N > 0, fmtMs(r.LatencyMs.P50)+" / "+fmtMs(r.LatencyMs.P99))
		if r.Missed > 0 {
			s += fmt.Sprintf(" (%d missed)", r.Missed)
		}
		return s
	})
	row("of which the first change after the start", func(r *PeerRun) string {
		if len(r.LatenciesMs) == 0 {
			return "-"
		}
		return fmtMs(r.LatenciesMs[0])
	})
	row("CPU s per 100 changes (own + nft/iptables)", func(r *PeerRun) string {
		if r.Changes == 0 {
			return "-"
		}
		f := 100 / float64(r.Changes)
		return fmt.Sprintf("%.2f (%.2f + %.2f)", r.per100(), r.CPU.Self*f, r.CPU.Children*f)
	})
	row("peak RSS programmed / after changes", func(r *PeerRun) string {
		return ifMeasured(r.RSSProgrammedMB > 0, fmt.Sprintf("%.0f / %.0f MB", r.RSSProgrammedMB, r.RSSEndMB))
	})
	row("idle CPU", func(r *PeerRun) string {
		return ifMeasured(r.IdleS > 0, fmt.Sprintf("%.2f s in %.0f s", r.IdleCPU.Total(), r.IdleS))
	})
	return b.String()
}

func peerOrder(id string) int {
	for i, p := range peerProxyNames {
		if p.id == id {
			return i
		}
	}
	return len(peerProxyNames)
}

func ifMeasured(ok bool, s string) string {
	if !ok {
		return "-"
	}
	return s
}
