package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Results is everything one run measured; it is written as results.json.
type Results struct {
	Meta      Meta              `json:"meta"`
	Mix       mixCount          `json:"mix"`
	Control   []*ControlResult  `json:"control"`
	Baseline  []*BaselineResult `json:"baseline"`
	DataPlane []DataPlaneResult `json:"data_plane"`
	Sim       []SimResult       `json:"simulator"`
	Peer      *PeerResults      `json:"peer,omitempty"`
	Targets   []Target          `json:"targets"`
	// Errors lists the phases that failed; the rest of the results stand.
	Errors []string `json:"errors,omitempty"`
}

// Meta describes the run and the machine.
type Meta struct {
	Started             time.Time `json:"started"`
	Seconds             float64   `json:"seconds"`
	Command             string    `json:"command"`
	Quick               bool      `json:"quick"`
	CPUs                int       `json:"cpus"`
	Kernel              string    `json:"kernel"`
	Nft                 string    `json:"nft"`
	Go                  string    `json:"go"`
	Path                string    `json:"path"`
	Baseline            string    `json:"baseline"`
	IptablesLegacy      string    `json:"iptables_legacy"`
	IptablesNFT         string    `json:"iptables_nft"`
	EndpointsPerService int       `json:"endpoints_per_service"`
	RSSMeasuredBy       string    `json:"rss_measured_by"`
	NFTBaselineMax      int       `json:"nft_baseline_max"`
}

// Target is one of the targets, met or not. Met is nil when the run did not
// measure what the target needs.
type Target struct {
	Name string `json:"name"`
	Got  string `json:"got"`
	Met  *bool  `json:"met"`
}

func (t Target) status() string {
	switch {
	case t.Met == nil:
		return "not measured"
	case *t.Met:
		return "met"
	default:
		return "**MISSED**"
	}
}

func ptr(b bool) *bool { return &b }

func (r *Results) control(n int) *ControlResult {
	for _, c := range r.Control {
		if c.N == n {
			return c
		}
	}
	return nil
}

func (r *Results) dataPlane(n int, rs string) *DataPlaneResult {
	for i := range r.DataPlane {
		if d := &r.DataPlane[i]; d.N == n && d.Ruleset == rs {
			return d
		}
	}
	return nil
}

func (r *Results) sim(n int) *SimResult {
	for i := range r.Sim {
		if r.Sim[i].N == n {
			return &r.Sim[i]
		}
	}
	return nil
}

// evaluateTargets fills in r.Targets.
func (r *Results) evaluateTargets() {
	r.Targets = nil
	add := func(name, got string, met *bool) {
		r.Targets = append(r.Targets, Target{Name: name, Got: got, Met: met})
	}

	if c := r.control(50000); c != nil {
		add("full sync of 50k Services x 5 endpoints <= 5 s", fmt.Sprintf("%.2f s", c.Full.TotalMs/1e3), ptr(c.Full.TotalMs <= 5000))
	} else {
		add("full sync of 50k Services x 5 endpoints <= 5 s", "50k not run", nil)
	}

	var times, ops []string
	timeOK, opsOK := true, true
	for _, c := range r.Control {
		if c.Update.N == 0 {
			continue
		}
		times = append(times, fmt.Sprintf("%s: %.1f ms", short(c.N), c.Update.P50))
		ops = append(ops, fmt.Sprintf("%s: %.0f", short(c.N), c.Ops.P50))
		timeOK = timeOK && c.Update.P50 <= 25
		opsOK = opsOK && c.Ops.P50 <= 20
	}
	if len(times) > 0 {
		add("one-Service update <= 25 ms (p50) at every N", strings.Join(times, ", "), ptr(timeOK))
		add("one-Service update <= 20 operations (p50) at every N", strings.Join(ops, ", "), ptr(opsOK))
	}
	small, large := r.control(1000), r.control(50000)
	switch {
	case small != nil && large != nil && small.Update.N > 0 && large.Update.N > 0:
		ratio := large.Update.P50 / small.Update.P50
		add("one-Service update p50 at 50k / at 1k <= 1.3", fmt.Sprintf("%.2f", ratio), ptr(ratio <= 1.3))
	case small != nil && len(r.Control) > 1 && small.Update.N > 0:
		big := r.Control[len(r.Control)-1]
		add("one-Service update p50 at 50k / at 1k <= 1.3", fmt.Sprintf("50k not run (%s / 1k: %.2f)", short(big.N), big.Update.P50/small.Update.P50), nil)
	default:
		add("one-Service update p50 at 50k / at 1k <= 1.3", "not run", nil)
	}

	if big := r.control(maxServices); big != nil {
		r.addMillionTargets(add, small, big)
	}

	d100, d50k := r.dataPlane(100, rulesetOurs), r.dataPlane(50000, rulesetOurs)
	if d100 != nil && d50k != nil {
		diff := d50k.Micros.P50 - d100.Micros.P50
		add("connect p50 at 50k within 2 us of that at 100", fmt.Sprintf("%+.1f us (%.1f vs %.1f us)", diff, d50k.Micros.P50, d100.Micros.P50), ptr(diff <= 2))
	} else {
		add("connect p50 at 50k within 2 us of that at 100", "not run at both sizes", nil)
	}

	s1, s50 := r.sim(1000), r.sim(50000)
	if s1 != nil && s50 != nil {
		ratio := s50.NsPerTrace.P50 / s1.NsPerTrace.P50
		add("simulator trace at 50k <= 1.5x its time at 1k", fmt.Sprintf("%.2fx (%.0f vs %.0f ns)", ratio, s50.NsPerTrace.P50, s1.NsPerTrace.P50), ptr(ratio <= 1.5))
	} else {
		add("simulator trace at 50k <= 1.5x its time at 1k", "not run at both sizes", nil)
	}
}

// addMillionTargets adds the targets of the largest point, 100k Services (the
// million-endpoint point when run with --endpoints 10), beside small at 1k.
func (r *Results) addMillionTargets(add func(string, string, *bool), small, big *ControlResult) {
	at := fmt.Sprintf("%s Services x %d endpoints", short(big.N), big.Endpoints)
	add("full sync of "+at+" <= 5 s", fmt.Sprintf("%.2f s (build %.2f s + sync %.2f s)", big.Full.TotalMs/1e3, big.Full.BuildMs/1e3, big.Full.SyncMs/1e3), ptr(big.Full.TotalMs <= 5000))
	name := "one-Service update p50 at " + at + " / at 1k <= 1.3"
	if small != nil && small.Update.N > 0 && big.Update.N > 0 {
		ratio := big.Update.P50 / small.Update.P50
		add(name, fmt.Sprintf("%.2f (%s / %s)", ratio, fmtMs(big.Update.P50), fmtMs(small.Update.P50)), ptr(ratio <= 1.3))
	} else {
		add(name, "1k not run", nil)
	}
	add("peak RSS of the first sync of "+at+" <= 1 GB", fmt.Sprintf("%.0f MB", big.PeakRSSFullMB), ptr(big.PeakRSSFullMB <= 1024))
}

// short writes N as 100, 1k, 50k.
func short(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// write writes results.json, results.md and plot.png into dir.
func (r *Results) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(r.markdown()), 0o644); err != nil {
		return err
	}
	return writePlot(filepath.Join(dir, "plot.png"), r)
}

func fmtMs(ms float64) string {
	switch {
	case ms < 0:
		return "timeout"
	case ms >= 10000:
		return fmt.Sprintf("%.1f s", ms/1e3)
	case ms >= 1000:
		return fmt.Sprintf("%.2f s", ms/1e3)
	case ms >= 100:
		return fmt.Sprintf("%.0f ms", ms)
	default:
		return fmt.Sprintf("%.1f ms", ms)
	}
}

// markdown renders the results as the tables of results.md.
func (r *Results) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	m := r.Meta
	w("# nftproxy scale benchmark")
	w("")
	w("%s, %d CPUs, kernel %s, %s, %s. Run %s, %.0f s%s.", m.Go, m.CPUs, m.Kernel, m.Nft, m.IptablesLegacy,
		m.Started.Format("2006-01-02 15:04 MST"), m.Seconds, map[bool]string{true: " (--quick)", false: ""}[m.Quick])
	w("")
	if r.Peer != nil {
		b.WriteString(r.Peer.markdown())
		if len(r.Control) == 0 && len(r.Baseline) == 0 {
			return b.String() // a --peer run
		}
	}
	w("Clusters: N Services x %d endpoints; at the largest N: %d ClusterIP, %d NodePort, %d LoadBalancer, %d externalTrafficPolicy Local, %d sessionAffinity ClientIP, %d loadBalancerSourceRanges, %d UDP.",
		m.EndpointsPerService, r.Mix.ClusterIP, r.Mix.NodePort, r.Mix.LoadBalancer, r.Mix.ETPLocal, r.Mix.Affinity, r.Mix.SourceRanges, r.Mix.UDP)
	w("Ours: `%s` through real knftables into a fresh network namespace. Baseline: upstream kube-proxy's iptables-mode layout loaded with `%s` into another fresh namespace.", m.Path, m.Baseline)
	w("")

	w("## Control plane (ours)")
	w("")
	w("| N | full sync (build + sync) | elements over netlink | then Builder index | ruleset objects | peak RSS: proxy (before the index) / nft | 1-Service update p50 / p90 | operations p50 / max | updates over netlink / through nft (of which deleting) | from-scratch Build |")
	w("|---:|---|---:|---:|---:|---|---|---|---|---:|")
	for _, c := range r.Control {
		tc := c.Transports
		w("| %s | %s (%s + %s) | %d | %s | %d | %.0f MB (%.0f MB) / %.0f MB | %s / %s | %.0f / %.0f | %d (%d), p50 %s / %d (%d), p50 %s | %s |", short(c.N),
			fmtMs(c.Full.TotalMs), fmtMs(c.Full.BuildMs), fmtMs(c.Full.SyncMs), c.Full.NetlinkElements, fmtMs(c.Full.IndexMs), c.Objects,
			c.PeakRSSFullMB, c.PeakRSSWriteMB, c.NftPeakRSSMB, fmtMs(c.Update.P50), fmtMs(c.Update.P90), c.Ops.P50, c.Ops.Max,
			tc.Netlink, tc.NetlinkDeleting, fmtMs(tc.NetlinkP50Ms), tc.NFT, tc.NFTDeleting, fmtMs(tc.NFTP50Ms), fmtMs(c.PureBuildMs))
	}
	w("")
	if len(r.Control) > 0 {
		if c := r.Control[len(r.Control)-1]; c.Shape != nil {
			w("Ruleset at %s: %d chains, %d rules, %d sets, %d maps (none per Service); elements: %s.", short(c.N),
				c.Shape.Chains, c.Shape.Rules, c.Shape.Sets, c.Shape.Maps, topElements(c.Shape.Elements, 8))
			w("")
		}
	}
	w("The full sync writes a from-scratch `ruleset.Build` (nft for chains, rules, sets and maps; one netlink batch for the elements), as the proxier's first sync does; the Builder then indexes every Service and the Syncer takes its ruleset over with a diff (\"then Builder index\", while the table already serves). Peak RSS is VmHWM of a child process that only generates the cluster and syncs it (after the full sync and the index), and the largest nft process it ran. Updates: %s, an endpoint added to a random Service then removed again.", updateCount(r))
	for _, c := range r.Control {
		if ch := c.Churn; ch != nil {
			w("")
			w("Churn at %s: %.0f Service changes/s offered for %.0f s with min-sync-period 0, each sync applying what arrived since the last (at most %d): **%.0f changes/s applied** in %d syncs (batch p50 %.0f, max %.0f; sync p50 %s, max %s, of which build p50 %s and apply (nft or netlink) p50 %s; %d operations in all; backlog at the end %d).",
				short(ch.N), ch.OfferedRate, ch.Seconds, ch.BatchCap, ch.Throughput, ch.Syncs, ch.Batch.P50, ch.Batch.Max,
				fmtMs(ch.Sync.P50), fmtMs(ch.Sync.Max), fmtMs(ch.BuildMs.P50), fmtMs(ch.NftMs.P50), ch.Operations, ch.BacklogAtEnd)
		}
	}
	for _, c := range r.Control {
		if rs := c.Resync; rs != nil {
			w("")
			w("Periodic resync at %s: %s when nothing but the Syncer wrote to nf_tables since (the generation verified, %d operations: what changed), %s after another writer's transaction (the table rewritten: %d operations, %d elements over netlink).",
				short(c.N), fmtMs(rs.Verified.TotalMs), rs.Verified.Operations, fmtMs(rs.Rewrite.TotalMs), rs.Rewrite.Operations, rs.Rewrite.NetlinkElements)
		}
	}
	for _, c := range r.Control {
		if rs := c.Restart; rs != nil {
			w("")
			w("Restart at %s: a new Builder and Syncer take over the table the measured ones left, as a restarted proxier does: programmed in %s (build %s + sync %s; %d operations, %d elements over netlink), then Builder index %s.",
				short(c.N), fmtMs(rs.TotalMs), fmtMs(rs.BuildMs), fmtMs(rs.SyncMs), rs.Operations, rs.NetlinkElements, fmtMs(rs.IndexMs))
		}
	}
	w("")

	w("## Control plane (baseline: kube-proxy iptables mode)")
	w("")
	w("| N | backend | rules / chains | full sync (generate + restore) | 1-Service update, full-table restore p50 (n) | partial restore (kube-proxy >= 1.27) p50 (n) | note |")
	w("|---:|---|---|---|---|---|---|")
	for _, bl := range r.Baseline {
		w("| %s | iptables-%s | %d / %d | %s | %s (%d) | %s (%d) | %s |", short(bl.N), bl.Backend, bl.Rules, bl.Chains,
			fmtMs(bl.Full.TotalMs), fmtMs(bl.Update.P50), bl.Update.N, fmtMs(bl.PartialUpdate.P50), bl.PartialUpdate.N, bl.Note)
	}
	w("")
	w("kube-proxy writes the whole table on a full sync (and, before MinimizeIPTablesRestore, on every change); the partial restore rewrites KUBE-SERVICES, KUBE-NODEPORTS and the filter chains whole plus the changed Service's chains. Per-endpoint comments are dropped past 1000 endpoints, as kube-proxy does. The iptables-nft backend (%s) runs only up to N = %s (--nft-baseline-max): its restore looks chains up by a linear scan, so its time grows with the square of the chain count (a 10k load took over 10 minutes on this machine).",
		m.IptablesNFT, short(m.NFTBaselineMax))
	w("")

	if len(r.DataPlane) > 0 {
		w("## Data plane: new-connection latency")
		w("")
		w("Client pod -> node (DNAT, forward) -> backend pod, blocking connect() to the target ClusterIP, interleaved across all rulesets; the target is last in KUBE-SERVICES.")
		w("")
		w("| N | ours p50 | ours p99 | iptables p50 | iptables p99 | connects each |")
		w("|---:|---:|---:|---:|---:|---:|")
		var ns []int
		for _, d := range r.DataPlane {
			if !slices.Contains(ns, d.N) {
				ns = append(ns, d.N)
			}
		}
		for _, n := range ns {
			o, ip := r.dataPlane(n, rulesetOurs), r.dataPlane(n, rulesetIptables)
			cell := func(d *DataPlaneResult, p99 bool) string {
				if d == nil {
					return "-"
				}
				if p99 {
					return fmt.Sprintf("%.1f us", d.Micros.P99)
				}
				return fmt.Sprintf("%.1f us", d.Micros.P50)
			}
			count := 0
			if o != nil {
				count = o.Connects
			}
			w("| %s | %s | %s | %s | %s | %d |", short(n), cell(o, false), cell(o, true), cell(ip, false), cell(ip, true), count)
		}
		w("")
	}

	if len(r.Sim) > 0 {
		w("## Simulator")
		w("")
		w("| N | compile | ns per trace p50 | p90 | traces | branches |")
		w("|---:|---:|---:|---:|---:|---:|")
		for _, s := range r.Sim {
			w("| %s | %.2f s | %.0f | %.0f | %d | %d |", short(s.N), s.CompileS, s.NsPerTrace.P50, s.NsPerTrace.P90, s.Traces, s.Branches)
		}
		w("")
	}

	w("## Targets")
	w("")
	w("| target | measured | status |")
	w("|---|---|---|")
	for _, t := range r.Targets {
		w("| %s | %s | %s |", t.Name, t.Got, t.status())
	}
	if len(r.Errors) > 0 {
		w("")
		w("## Errors")
		w("")
		for _, e := range r.Errors {
			w("- %s", e)
		}
	}
	return b.String()
}

func updateCount(r *Results) string {
	for _, c := range r.Control {
		if len(c.Updates) > 0 {
			return fmt.Sprintf("%d per N", len(c.Updates))
		}
	}
	return "none"
}

// topElements lists the k sets and maps with the most elements.
func topElements(m map[string]int, k int) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for i, n := range names {
		if i == k {
			parts = append(parts, "...")
			break
		}
		parts = append(parts, fmt.Sprintf("%s %d", n, m[n]))
	}
	return strings.Join(parts, ", ")
}
