package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state"
)

// ControlResult is the control-plane measurement of our proxier at one N, made by
// a child process (so that its peak RSS is the sync's alone) inside a fresh
// namespace.
type ControlResult struct {
	N int `json:"n"`
	// Endpoints is the endpoint count of every generated Service.
	Endpoints int    `json:"endpoints_per_service"`
	Path      string `json:"path"`
	// Objects is the number of chains, rules, sets, maps and elements of the ruleset.
	Objects int `json:"objects"`
	// Shape counts the ruleset's chains, rules, sets and maps, and the elements of
	// each set and map.
	Shape *rulesetShape `json:"shape,omitempty"`
	Full  UpdateStats   `json:"full_sync"`
	// PeakRSSFullMB is VmHWM of the child right after the full sync: generating the
	// cluster, building and syncing it (the nft processes are not counted).
	PeakRSSFullMB float64 `json:"peak_rss_full_mb"`
	// PeakRSSWriteMB is VmHWM after the full sync's write, before the Builder's
	// index: which of the two set PeakRSSFullMB.
	PeakRSSWriteMB float64 `json:"peak_rss_write_mb,omitempty"`
	// PeakRSSEndMB is VmHWM at the end, after the updates and the churn.
	PeakRSSEndMB float64 `json:"peak_rss_end_mb"`
	// HeapFullMB is the Go heap in use after the full sync and a GC.
	HeapFullMB float64 `json:"heap_after_full_mb"`
	// NftPeakRSSMB is ru_maxrss of the child's children: an upper bound of the nft
	// processes' peak RSS, since exec from the address space os/exec shares with
	// its parent (CLONE_VM|CLONE_VFORK) carries the child's own high-water mark
	// over to the new program.
	NftPeakRSSMB float64 `json:"nft_peak_rss_mb"`
	// Updates are the one-Service updates, in order.
	Updates []UpdateStats `json:"updates"`
	Update  Summary       `json:"update_ms"`
	Ops     Summary       `json:"update_operations"`
	// Transports says how the one-Service updates went: over netlink or through
	// nft, and how many of each deleted something.
	Transports transportCounts `json:"update_transports"`
	// PureBuildMs is the time of a from-scratch ruleset.Build of the whole state
	// (the O(cluster) path the incremental builder replaces), median of a few.
	PureBuildMs float64      `json:"pure_build_ms"`
	Churn       *ChurnResult `json:"churn,omitempty"`
	// Resync is the periodic full sync, once while nothing but the Syncer wrote
	// to nf_tables (verified by the generation: only what changed is written) and
	// once after another writer's transaction (the table rewritten).
	Resync *ResyncStats `json:"resync,omitempty"`
	// Restart is the first sync of a new Builder and Syncer over the table the
	// measured ones left, as a restarted proxier's: adopting a table it did not write.
	Restart *UpdateStats `json:"restart,omitempty"`
}

// ResyncStats are the two kinds of periodic full sync (see syncer.Generations).
type ResyncStats struct {
	Verified UpdateStats `json:"verified"`
	Rewrite  UpdateStats `json:"rewrite"`
}

// UpdateStats is one sync.
type UpdateStats struct {
	Service string  `json:"service,omitempty"`
	Kind    string  `json:"kind,omitempty"`
	Change  string  `json:"change,omitempty"`
	BuildMs float64 `json:"build_ms"`
	SyncMs  float64 `json:"sync_ms"`
	TotalMs float64 `json:"total_ms"`
	// IndexMs, after a first sync, is the time the incremental builder then took
	// to index every Service (not part of TotalMs: the table was complete).
	IndexMs float64 `json:"index_ms,omitempty"`
	// NetlinkElements is the number of elements the sync loaded over netlink.
	NetlinkElements int  `json:"netlink_elements,omitempty"`
	Operations      int  `json:"operations"`
	Full            bool `json:"full"`
	// Deleted is true when the sync deleted an element, chain, set or map.
	Deleted bool `json:"deleted,omitempty"`
	// Verified is true for a full sync due that found nf_tables untouched by
	// other writers and wrote only what changed.
	Verified bool `json:"verified,omitempty"`
}

// transportCounts counts syncs by the way they went: over netlink (element
// operations only) or through an nft transaction, and of each, how many deleted
// something (deletions cost more in the kernel on some machines).
type transportCounts struct {
	Netlink         int     `json:"netlink"`
	NetlinkDeleting int     `json:"netlink_deleting"`
	NFT             int     `json:"nft"`
	NFTDeleting     int     `json:"nft_deleting"`
	NetlinkP50Ms    float64 `json:"netlink_p50_ms"`
	NFTP50Ms        float64 `json:"nft_p50_ms"`
}

// countTransports counts us by transport (see transportCounts).
func countTransports(us []UpdateStats) transportCounts {
	var c transportCounts
	var nl, nft []float64
	for _, u := range us {
		if u.NetlinkElements > 0 {
			c.Netlink++
			nl = append(nl, u.TotalMs)
			if u.Deleted {
				c.NetlinkDeleting++
			}
		} else if u.Operations > 0 {
			c.NFT++
			nft = append(nft, u.TotalMs)
			if u.Deleted {
				c.NFTDeleting++
			}
		}
	}
	c.NetlinkP50Ms, c.NFTP50Ms = summarize(nl).P50, summarize(nft).P50
	return c
}

// ChurnResult is the sustained-churn measurement: Service changes arrive at a
// steady offered rate and each sync applies whatever changed since the last one
// (min-sync-period 0).
type ChurnResult struct {
	N           int     `json:"n"`
	Seconds     float64 `json:"seconds"`
	OfferedRate float64 `json:"offered_per_second"`
	Changes     int     `json:"changes"`
	Syncs       int     `json:"syncs"`
	Throughput  float64 `json:"changes_per_second"`
	MeanBatch   float64 `json:"mean_batch"`
	Sync        Summary `json:"sync_ms"`
	BuildMs     Summary `json:"build_ms"`
	NftMs       Summary `json:"nft_ms"`
	Batch       Summary `json:"batch"`
	FullSyncs   int     `json:"full_syncs"`
	// BatchCap bounds the changes one sync applies (one second's worth).
	BatchCap     int `json:"batch_cap"`
	Operations   int `json:"operations"`
	BacklogAtEnd int `json:"backlog_at_end"`
}

// controlOptions configures a control-plane child.
type controlOptions struct {
	N          int
	Endpoints  int
	Updates    int
	Seed       uint64
	Churn      time.Duration
	ChurnRate  float64
	PureBuilds int
	TargetVIP  netip.Addr
	Backends   []netip.Addr
	// HeapProfile, when set, is where the child writes its heap profile at the
	// first sync's peak (see incrementalApplier.first).
	HeapProfile string
	// CPUProfile, when set, is where the child writes the CPU profile of its
	// first sync (see startCPUProfile).
	CPUProfile  string
	hostNetns   string
	progressOut io.Writer
}

func (o controlOptions) args() []string {
	a := []string{"child-control",
		"-n", strconv.Itoa(o.N), "-endpoints", strconv.Itoa(o.Endpoints), "-updates", strconv.Itoa(o.Updates),
		"-seed", strconv.FormatUint(o.Seed, 10), "-churn", o.Churn.String(),
		"-churn-rate", strconv.FormatFloat(o.ChurnRate, 'f', -1, 64),
		"-pure-builds", strconv.Itoa(o.PureBuilds), "-host-netns", o.hostNetns,
	}
	if o.HeapProfile != "" {
		a = append(a, "-heap-profile", o.HeapProfile)
	}
	if o.CPUProfile != "" {
		a = append(a, "-cpu-profile", o.CPUProfile)
	}
	if o.TargetVIP.IsValid() {
		var bs []string
		for _, b := range o.Backends {
			bs = append(bs, b.String())
		}
		a = append(a, "-target", o.TargetVIP.String(), "-backends", strings.Join(bs, ","))
	}
	return a
}

// netnsID returns "device:inode" of the calling thread's network namespace.
func netnsID(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// measureControl runs a control-plane child inside ns and returns its result. The
// child's progress lines are relayed to p.
func measureControl(ctx context.Context, p *progress, ns *lab.NS, o controlOptions) (*ControlResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("control N=%d: finding the bench binary: %w", o.N, err)
	}
	if o.hostNetns, err = netnsID("/proc/self/ns/net"); err != nil {
		return nil, err
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, exe, o.args()...)
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	// The child dies with us should we be killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	// Started from the thread switched into ns, the child runs inside it.
	if err := ns.Do(cmd.Start); err != nil {
		return nil, fmt.Errorf("control N=%d: starting the child in netns %s: %w", o.N, ns, err)
	}
	var tail []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		p.printf("%s", sc.Text())
		tail = append(tail, sc.Text())
		if len(tail) > 20 {
			tail = tail[1:]
		}
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("control N=%d: child in netns %s: %w: %s", o.N, ns, err, strings.Join(tail, "\n"))
	}
	var res ControlResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("control N=%d: reading the child's result: %w", o.N, err)
	}
	return &res, nil
}

// runControlChild is the child process: it must already be in a namespace of its
// own, which it checks before running nft.
func runControlChild(args []string) error {
	fs := flag.NewFlagSet("child-control", flag.ContinueOnError)
	var o controlOptions
	var seed uint64
	var target, backends string
	fs.IntVar(&o.N, "n", 1000, "Services")
	fs.IntVar(&o.Endpoints, "endpoints", endpointsPerService, "endpoints per Service")
	fs.IntVar(&o.Updates, "updates", 60, "one-Service updates")
	fs.Uint64Var(&seed, "seed", 1, "seed of the changes")
	fs.DurationVar(&o.Churn, "churn", 0, "churn duration (0: none)")
	fs.Float64Var(&o.ChurnRate, "churn-rate", 2000, "offered Service changes per second")
	fs.IntVar(&o.PureBuilds, "pure-builds", 3, "from-scratch Builds to time")
	fs.StringVar(&o.hostNetns, "host-netns", "", "device:inode of the namespace the bench started in")
	fs.StringVar(&target, "target", "", "ClusterIP of the data-plane target Service")
	fs.StringVar(&backends, "backends", "", "its endpoints, comma-separated")
	fs.StringVar(&heapProfile, "heap-profile", "", "file for the heap profile at the first sync's peak")
	fs.StringVar(&cpuProfile, "cpu-profile", "", "file for the CPU profile of the first sync")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Seed = seed
	if err := checkPlan(o.N, o.Endpoints); err != nil {
		return fmt.Errorf("child-control: %w", err)
	}
	mine, err := netnsID("/proc/self/ns/net")
	if err != nil {
		return err
	}
	if o.hostNetns == "" || mine == o.hostNetns {
		return fmt.Errorf("child-control: refusing to run nft in the namespace the bench started in (%s)", mine)
	}
	if target != "" {
		if o.TargetVIP, err = netip.ParseAddr(target); err != nil {
			return fmt.Errorf("child-control: -target: %w", err)
		}
		for _, s := range strings.Split(backends, ",") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return fmt.Errorf("child-control: -backends: %w", err)
			}
			o.Backends = append(o.Backends, a)
		}
	}
	ctx, stop := signalContext()
	defer stop()
	res, err := controlChild(ctx, o, os.Stderr)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func controlChild(ctx context.Context, o controlOptions, log io.Writer) (*ControlResult, error) {
	say := func(format string, args ...any) { fmt.Fprintf(log, "  "+format+"\n", args...) }
	c := newClusterM(o.N, o.Endpoints)
	if o.TargetVIP.IsValid() {
		c.addTarget(o.TargetVIP, o.Backends)
	}
	cfg := rulesetConfig()
	nft, err := proxier.DefaultNewNFT(knftables.IPv4Family, cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("knftables: %w", err)
	}
	a := newApplier(nft, cfg)
	res := &ControlResult{N: o.N, Endpoints: o.Endpoints, Path: a.path()}

	// Full sync.
	stopCPU, err := startCPUProfile()
	if err != nil {
		return nil, err
	}
	st, err := a.apply(ctx, c.state, nil)
	stopCPU()
	if err != nil {
		return nil, fmt.Errorf("full sync of %d Services: %w", o.N, err)
	}
	res.Full = stats(st)
	res.PeakRSSFullMB, res.PeakRSSWriteMB = vmHWM(), st.PeakRSSWriteMB
	say("full sync: %.2fs (build %.2fs, sync %.2fs, %d operations, %d elements over netlink), then builder index %.2fs; peak RSS %.0f MB (%.0f MB before the index)",
		res.Full.TotalMs/1e3, res.Full.BuildMs/1e3, res.Full.SyncMs/1e3, res.Full.Operations, res.Full.NetlinkElements, res.Full.IndexMs/1e3, res.PeakRSSFullMB, res.PeakRSSWriteMB)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapFullMB = float64(ms.HeapInuse) / (1 << 20)

	// One-Service updates: an endpoint is added to a random Service, then removed
	// again (a pod replaced), so that the cluster keeps its shape.
	rng := rand.New(rand.NewPCG(o.Seed, uint64(o.N)))
	var svc int
	for u := range o.Updates {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if u%2 == 0 {
			svc = c.randomService(rng)
		}
		ch := c.toggleEndpoint(svc)
		st, err := a.apply(ctx, c.state, map[state.ServiceName]bool{ch.Service: true})
		if err != nil {
			return nil, fmt.Errorf("update %d of Service %s: %w", u, ch.Service, err)
		}
		us := stats(st)
		us.Service, us.Kind, us.Change = ch.Service.String(), kindName(svc), changeName(ch)
		res.Updates = append(res.Updates, us)
	}
	var times, ops []float64
	for _, u := range res.Updates {
		times = append(times, u.TotalMs)
		ops = append(ops, float64(u.Operations))
	}
	res.Update, res.Ops = summarize(times), summarize(ops)
	res.Transports = countTransports(res.Updates)
	if len(res.Updates) > 0 {
		tc := res.Transports
		say("%d one-Service updates: p50 %.1f ms, p90 %.1f ms, operations p50 %.0f max %.0f; %d over netlink (p50 %.2f ms, %d deleting), %d through nft (p50 %.2f ms, %d deleting)",
			len(res.Updates), res.Update.P50, res.Update.P90, res.Ops.P50, res.Ops.Max,
			tc.Netlink, tc.NetlinkP50Ms, tc.NetlinkDeleting, tc.NFT, tc.NFTP50Ms, tc.NFTDeleting)
	}

	// The from-scratch Build, for comparison.
	var builds []float64
	for range o.PureBuilds {
		t0 := time.Now()
		rs := ruleset.Build(c.state, cfg, knftables.IPv4Family)
		builds = append(builds, ms64(time.Since(t0)))
		res.Objects, res.Shape = rs.NumObjects(), shapeOf(rs)
	}
	if len(builds) > 0 {
		res.PureBuildMs = summarize(builds).P50
		say("from-scratch ruleset.Build: %.0f ms (%d objects)", res.PureBuildMs, res.Objects)
	}

	if o.Churn > 0 {
		say("churn: %.0f changes/s offered for %s ...", o.ChurnRate, o.Churn)
		cr, err := churn(ctx, a, c, rng, o.Churn, o.ChurnRate)
		if err != nil {
			return nil, err
		}
		res.Churn = cr
		say("churn: %.0f changes/s applied (%d syncs, %d full; batch p50 %.0f max %.0f; sync p50 %.1f ms max %.1f ms, of which build p50 %.1f ms, apply (nft or netlink) p50 %.1f ms; backlog %d)",
			cr.Throughput, cr.Syncs, cr.FullSyncs, cr.Batch.P50, cr.Batch.Max, cr.Sync.P50, cr.Sync.Max, cr.BuildMs.P50, cr.NftMs.P50, cr.BacklogAtEnd)
	}
	if o.Updates > 0 {
		rs, err := measureResync(ctx, a, c.state)
		if err != nil {
			return nil, err
		}
		res.Resync = rs
		say("periodic resync: %.2f ms when nothing else wrote (verified %v, %d operations); %.2f s after another writer's transaction (full %v, %d elements over netlink)",
			rs.Verified.TotalMs, rs.Verified.Verified, rs.Verified.Operations, rs.Rewrite.TotalMs/1e3, rs.Rewrite.Full, rs.Rewrite.NetlinkElements)
	}
	res.PeakRSSEndMB = vmHWM()
	if o.Updates > 0 {
		a = nil // the restarted proxier's memory is its own
		runtime.GC()
		st, err := newApplier(nft, cfg).apply(ctx, c.state, nil)
		if err != nil {
			return nil, fmt.Errorf("restart: adopting the table of %d Services: %w", o.N, err)
		}
		rs := stats(st)
		res.Restart = &rs
		say("restart: a new Syncer adopts the table in %.2fs (build %.2fs, sync %.2fs, %d operations, %d elements over netlink), then builder index %.2fs",
			rs.TotalMs/1e3, rs.BuildMs/1e3, rs.SyncMs/1e3, rs.Operations, rs.NetlinkElements, rs.IndexMs/1e3)
	}
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru); err == nil {
		res.NftPeakRSSMB = float64(ru.Maxrss) / 1024 // kB
	}
	return res, nil
}

// churn offers Service changes at rate per second for d; each sync applies every
// change that arrived since the previous one, up to one second's worth (rate), so
// that an overloaded proxier's last sync cannot run for long past d. When the
// proxier keeps up, the throughput is the offered rate; when it does not, it is the
// proxier's capacity, and the backlog at the end says by how much it fell behind.
func churn(ctx context.Context, a applier, c *cluster, rng *rand.Rand, d time.Duration, rate float64) (*ChurnResult, error) {
	res := &ChurnResult{N: c.n, OfferedRate: rate, BatchCap: int(math.Ceil(rate))}
	var syncs, builds, nfts, batches []float64
	start := time.Now()
	produced := 0
	for {
		elapsed := time.Since(start)
		if elapsed >= d || ctx.Err() != nil {
			break
		}
		due := min(int(elapsed.Seconds()*rate)-produced, res.BatchCap)
		if due <= 0 {
			time.Sleep(time.Duration(float64(time.Second) / rate))
			continue
		}
		changed := map[state.ServiceName]bool{}
		for range due {
			ch := c.toggleEndpoint(c.randomService(rng))
			changed[ch.Service] = true
		}
		produced += due
		t0 := time.Now()
		st, err := a.apply(ctx, c.state, changed)
		if err != nil {
			return nil, fmt.Errorf("churn sync of %d changes: %w", due, err)
		}
		syncs = append(syncs, ms64(time.Since(t0)))
		builds, nfts, batches = append(builds, ms64(st.Build)), append(nfts, ms64(st.Sync)), append(batches, float64(due))
		if st.Result.Full {
			res.FullSyncs++
		}
		res.Changes += due
		res.Operations += st.Result.Operations
	}
	res.Seconds = time.Since(start).Seconds()
	res.Syncs = len(syncs)
	res.Throughput = float64(res.Changes) / res.Seconds
	if res.Syncs > 0 {
		res.MeanBatch = float64(res.Changes) / float64(res.Syncs)
	}
	res.Sync, res.BuildMs, res.NftMs, res.Batch = summarize(syncs), summarize(builds), summarize(nfts), summarize(batches)
	res.BacklogAtEnd = int(res.Seconds*rate) - produced
	return res, ctx.Err()
}

func stats(s applyStats) UpdateStats {
	return UpdateStats{
		BuildMs: ms64(s.Build), SyncMs: ms64(s.Sync), TotalMs: ms64(s.Build + s.Sync),
		IndexMs: ms64(s.Index), NetlinkElements: s.Result.NetlinkElements,
		Operations: s.Result.Operations, Full: s.Result.Full, Deleted: s.Result.Deleted, Verified: s.Result.Verified,
	}
}

func ms64(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// kindName describes Service i for the report.
func kindName(i int) string {
	typ, local, affinity, ranges := kindOf(i)
	k := typ
	if local {
		k += "+ETPLocal"
	}
	if affinity {
		k += "+affinity"
	}
	if ranges {
		k += "+sourceRanges"
	}
	return k
}

func changeName(ch change) string {
	if ch.Added {
		return "endpoint added"
	}
	return "endpoint removed"
}

// vmHWM returns the process's peak resident set size in MB.
func vmHWM() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// rulesetShape says what a ruleset is made of.
type rulesetShape struct {
	Chains   int            `json:"chains"`
	Rules    int            `json:"rules"`
	Sets     int            `json:"sets"`
	Maps     int            `json:"maps"`
	Elements map[string]int `json:"elements"`
}

func shapeOf(rs *ruleset.Ruleset) *rulesetShape {
	sh := &rulesetShape{Chains: len(rs.Chains), Sets: len(rs.Sets), Maps: len(rs.Maps), Elements: map[string]int{}}
	for _, c := range rs.Chains {
		sh.Rules += len(c.Rules)
	}
	for name, es := range rs.Elements {
		sh.Elements[name] += len(es)
	}
	return sh
}

// measureResync times the periodic full sync of the table a has written to st:
// first with nothing else written to nf_tables since, then after another writer's
// transaction (a table of its own, added in the child's namespace).
func measureResync(ctx context.Context, a applier, st *state.ClusterState) (*ResyncStats, error) {
	var rs ResyncStats
	a.requestFullSync()
	v, err := a.apply(ctx, st, map[state.ServiceName]bool{})
	if err != nil {
		return nil, fmt.Errorf("resync: %w", err)
	}
	rs.Verified = stats(v)
	if out, err := exec.CommandContext(ctx, "nft", "add", "table", "ip", "nftproxy-bench-other").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("resync: another writer's transaction: %w: %s", err, out)
	}
	a.requestFullSync()
	w, err := a.apply(ctx, st, map[state.ServiceName]bool{})
	if err != nil {
		return nil, fmt.Errorf("resync after another writer: %w", err)
	}
	rs.Rewrite = stats(w)
	return &rs, nil
}
