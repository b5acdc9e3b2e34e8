// Command bench measures nftproxy at scale against upstream kube-proxy's iptables
// mode, in the same run, on this machine's kernel: control plane (full sync,
// one-Service updates, churn, memory), data plane (new-connection latency) and the
// simulator. It writes results.json, results.md and plot.png.
//
// It needs root: every kernel measurement runs in network namespaces it creates
// (e2e/lab) and removes again, also on failure and on Ctrl-C. Nothing touches the
// namespace the bench starts in.
//
//	go run ./tools/bench            # full run, N = 1k, 10k, 50k (about 10 minutes)
//	go run ./tools/bench --quick    # N <= 10k (about 2 minutes)
//	go run ./tools/bench --peer     # beside the real kube-proxy on a real API server
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/proxier/syncer"
)

func main() {
	syncer.TuneNFT() // nft's malloc tunables, as cmd/nftproxy sets them
	if len(os.Args) > 1 && os.Args[1] == "child-control" {
		if err := runControlChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signalContext()
	defer stop()
	p := newProgress(os.Stderr)
	res, err := run(ctx, o, p)
	if res != nil {
		if werr := res.write(o.out); werr != nil {
			fmt.Fprintln(os.Stderr, "bench: writing results:", werr)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "\nwrote %s/results.json, results.md and plot.png\n\n", o.out)
		fmt.Print(res.markdown())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		if ctx.Err() != nil {
			os.Exit(130)
		}
		os.Exit(1)
	}
}

// signalContext is cancelled by SIGINT or SIGTERM; a second signal kills the
// process at once (the default action comes back after the first).
func signalContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// options are the bench's flags.
type options struct {
	quick          bool
	sizes          []int
	endpoints      int
	dataSizes      []int
	simSizes       []int
	updates        int
	churn          time.Duration
	churnRate      float64
	churnAt        int
	connects       int
	warmup         int
	backend        string
	nftMax         int
	budget         time.Duration
	restoreTimeout time.Duration
	simTime        time.Duration
	out            string
	phases         map[string]bool
	seed           uint64
	heapProfile    bool
	cpuProfile     bool
	peer           peerOptions
	args           []string
}

var allPhases = []string{"control", "baseline", "dataplane", "sim"}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var sizes, dataSizes, simSizes, phases string
	fs.BoolVar(&o.quick, "quick", false, "a ~2-minute run with N <= 10k (defaults below change accordingly)")
	fs.StringVar(&sizes, "sizes", "", "control-plane N, comma-separated, up to 100000 (default 1000,10000,50000; quick 1000,10000)")
	fs.IntVar(&o.endpoints, "endpoints", endpointsPerService, "endpoints per Service of the control phase's clusters (other phases: always 5; with another value, run --phases control)")
	fs.StringVar(&dataSizes, "dataplane-sizes", "", "data-plane N (default 100,10000,50000; quick 100,10000)")
	fs.StringVar(&simSizes, "sim-sizes", "", "simulator N (default 1000,50000; quick 1000,10000)")
	fs.IntVar(&o.updates, "updates", 60, "one-Service updates per N")
	fs.DurationVar(&o.churn, "churn", 0, "churn duration at the largest N (default 10s; quick 5s)")
	fs.Float64Var(&o.churnRate, "churn-rate", 2000, "Service changes per second offered during the churn (a sync applies at most one second's worth)")
	fs.IntVar(&o.connects, "connects", 0, "TCP connects per ruleset (default 3000; quick 1000)")
	fs.StringVar(&o.backend, "iptables", backendLegacy, "backend of the baseline: legacy or nft")
	fs.IntVar(&o.nftMax, "nft-baseline-max", 1000, "also measure the iptables-nft backend up to this N (0: never; it takes ~10 min at 10k)")
	fs.DurationVar(&o.budget, "baseline-budget", 0, "time for the baseline's update samples per N and kind (default 30s; quick 15s)")
	fs.DurationVar(&o.restoreTimeout, "restore-timeout", 5*time.Minute, "bound of one iptables-restore")
	fs.DurationVar(&o.simTime, "sim-time", 0, "time spent tracing (default 4s; quick 2s)")
	fs.StringVar(&o.out, "out", "bench-results", "output directory")
	fs.StringVar(&phases, "phases", strings.Join(allPhases, ","), "phases to run")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the Service changes")
	fs.BoolVar(&o.heapProfile, "heap-profile", false, "write each control child's heap at its peak (the first sync's ruleset and the Builder's both live) to OUT/heap-N.pprof")
	fs.BoolVar(&o.cpuProfile, "cpu-profile", false, "write the CPU profile of each control child's first sync (build, sync, the Builder's index) to OUT/cpu-N.pprof")
	checkPeer := peerFlags(fs, &o.peer)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := checkPeer(); err != nil {
		return o, err
	}
	outSet := false
	fs.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "out" })
	if o.peer.enabled && !outSet {
		o.out = filepath.Join(o.out, "peer") // beside a full run's results, not over them
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.args = args
	def := func(quick, full string) string {
		if o.quick {
			return quick
		}
		return full
	}
	var err error
	if o.sizes, err = parseSizesUpTo(cmp.Or(sizes, def("1000,10000", "1000,10000,50000")), maxServices); err != nil {
		return o, fmt.Errorf("-sizes: %w", err)
	}
	for _, n := range o.sizes {
		if err := checkPlan(n, o.endpoints); err != nil {
			return o, fmt.Errorf("-sizes, -endpoints: %w", err)
		}
	}
	if o.dataSizes, err = parseSizes(cmp.Or(dataSizes, def("100,10000", "100,10000,50000"))); err != nil {
		return o, fmt.Errorf("-dataplane-sizes: %w", err)
	}
	if o.simSizes, err = parseSizes(cmp.Or(simSizes, def("1000,10000", "1000,50000"))); err != nil {
		return o, fmt.Errorf("-sim-sizes: %w", err)
	}
	if o.churn == 0 {
		o.churn = map[bool]time.Duration{true: 5 * time.Second, false: 10 * time.Second}[o.quick]
	}
	if o.connects == 0 {
		o.connects = map[bool]int{true: 1000, false: 3000}[o.quick]
	}
	o.warmup = max(20, o.connects/10)
	if o.budget == 0 {
		o.budget = map[bool]time.Duration{true: 15 * time.Second, false: 30 * time.Second}[o.quick]
	}
	if o.simTime == 0 {
		o.simTime = map[bool]time.Duration{true: 2 * time.Second, false: 4 * time.Second}[o.quick]
	}
	if o.backend != backendLegacy && o.backend != backendNFT {
		return o, fmt.Errorf("-iptables %q: want legacy or nft", o.backend)
	}
	o.phases = map[string]bool{}
	for _, ph := range strings.Split(phases, ",") {
		if !slices.Contains(allPhases, ph) {
			return o, fmt.Errorf("-phases: unknown phase %q (want %s)", ph, strings.Join(allPhases, ", "))
		}
		o.phases[ph] = true
	}
	if o.endpoints != endpointsPerService && (o.phases["baseline"] || o.phases["dataplane"] || o.phases["sim"]) {
		return o, fmt.Errorf("-endpoints %d: only the control phase takes it (the baseline, data plane and simulator compare at %d); add --phases control", o.endpoints, endpointsPerService)
	}
	if len(o.sizes) > 0 {
		o.churnAt = slices.Max(o.sizes)
	}
	return o, nil
}

// parseSizes parses a list of N within the limit every phase allows.
func parseSizes(s string) ([]int, error) { return parseSizesUpTo(s, 60000) }

// parseSizesUpTo parses a list of N such as "1000,10k", each at most limit.
func parseSizesUpTo(s string, limit int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSuffix(f, "k"), "K"))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("size %q: want a positive number", f)
		}
		if strings.HasSuffix(strings.ToLower(f), "k") {
			n *= 1000
		}
		if n > limit {
			return nil, fmt.Errorf("size %d: at most %d (the address plan's limit)", n, limit)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Names of the rulesets the data plane compares.
const (
	rulesetOurs     = "nftproxy"
	rulesetIptables = "iptables"
)

// run runs every phase. A phase that fails at one N is recorded in Results.Errors
// and the run goes on; cancellation stops it, and the results so far are returned.
func run(ctx context.Context, o options, p *progress) (*Results, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root: every measurement runs in network namespaces the bench creates")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, errors.New("nft not found (make deps installs nftables)")
	}
	r := &benchRun{ctx: ctx, o: o, p: p, res: &Results{Meta: meta(o)}}
	start := time.Now()
	defer func() { r.res.Meta.Seconds = time.Since(start).Seconds() }()
	if o.peer.enabled {
		return r.res, runPeer(ctx, o.peer, p, r.res)
	}
	if o.phases["baseline"] || o.phases["dataplane"] {
		if _, err := exec.LookPath(restoreBinary(o.backend)); err != nil {
			r.fail(fmt.Errorf("baseline: %s not found (make deps installs iptables): skipping the baseline", restoreBinary(o.backend)))
			r.o.phases["baseline"] = false
		}
	}
	defer r.removeLabs()

	sizes := r.sizes()
	if len(sizes) > 0 {
		c := newClusterM(sizes[len(sizes)-1], r.o.endpoints)
		r.res.Mix = countMix(c.state)
	}
	for _, n := range sizes {
		if err := r.measureSize(n); err != nil {
			return r.res, err
		}
	}
	if err := r.dataPlanePhase(); err != nil {
		return r.res, err
	}
	if err := r.simPhase(); err != nil {
		return r.res, err
	}
	r.res.evaluateTargets()
	p.setPhase("done")
	return r.res, nil
}

// benchRun is one run of the bench: its options, the results so far, the labs it
// created and the ones kept for the data-plane phase.
type benchRun struct {
	ctx  context.Context
	o    options
	p    *progress
	res  *Results
	labs []*lab.Lab
	dps  []*dataPlaneLab
}

// fail reports err and records it in the results; the run goes on.
func (r *benchRun) fail(err error) {
	r.p.printf("FAILED: %v", err)
	r.res.Errors = append(r.res.Errors, err.Error())
}

// closeLab removes l, recording a failure to.
func (r *benchRun) closeLab(l *lab.Lab) {
	if err := l.Close(); err != nil {
		r.fail(fmt.Errorf("removing lab %s: %w", l.ID, err))
	}
}

// removeLabs removes every lab the run created, on the way out, and reports
// what one left behind.
func (r *benchRun) removeLabs() {
	for _, l := range r.labs {
		if err := l.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: removing lab %s: %v\n", l.ID, err)
		}
		if left, _ := l.Leaks(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "bench: lab %s left behind: %s\n", l.ID, strings.Join(left, ", "))
		}
	}
}

// sizes returns the cluster sizes the control, baseline and data-plane phases
// measure, in order.
func (r *benchRun) sizes() []int {
	var sizes []int
	if r.o.phases["control"] || r.o.phases["baseline"] {
		sizes = append(sizes, r.o.sizes...)
	}
	if r.o.phases["dataplane"] {
		sizes = append(sizes, r.o.dataSizes...)
	}
	slices.Sort(sizes)
	return slices.Compact(sizes)
}

// measureSize runs the control and baseline phases at cluster size n, keeping
// the labs the data-plane phase measures. It returns an error only when the
// context ends.
func (r *benchRun) measureSize(n int) error {
	o := r.o
	dataPlane := o.phases["dataplane"] && slices.Contains(o.dataSizes, n)
	controlAt := slices.Contains(o.sizes, n) || slices.Contains(o.dataSizes, n)
	if (o.phases["control"] && controlAt) || dataPlane {
		if ok, err := r.controlPhase(n, dataPlane); err != nil || !ok {
			return err
		}
	}
	if (o.phases["baseline"] && controlAt) || (dataPlane && o.phases["baseline"]) {
		if ok, err := r.baselinePhase(n, dataPlane); err != nil || !ok {
			return err
		}
	}
	if o.phases["baseline"] && o.backend != backendNFT && n <= o.nftMax && slices.Contains(o.sizes, n) {
		return r.nftBaselinePhase(n)
	}
	return nil
}

// controlPhase measures our proxier at size n in a new lab, kept for the data
// plane when dataPlane. It reports false when the lab could not be made, which
// ends the size.
func (r *benchRun) controlPhase(n int, dataPlane bool) (bool, error) {
	o := r.o
	r.p.setPhase("control/ours N=%s", short(n))
	l, err := newBenchLab()
	if err != nil {
		r.fail(fmt.Errorf("control N=%d: lab: %w", n, err))
		return false, nil
	}
	r.labs = append(r.labs, l)
	co := controlOptions{N: n, Endpoints: o.endpoints, Updates: o.updates, Seed: o.seed, ChurnRate: o.churnRate, PureBuilds: 3,
		TargetVIP: targetVIP, Backends: backends}
	if o.heapProfile {
		co.HeapProfile = filepath.Join(o.out, fmt.Sprintf("heap-%s.pprof", short(n)))
	}
	if o.cpuProfile {
		co.CPUProfile = filepath.Join(o.out, fmt.Sprintf("cpu-%s.pprof", short(n)))
	}
	if !o.phases["control"] {
		co.Updates, co.PureBuilds = 0, 0
	}
	if o.phases["control"] && n == o.churnAt {
		co.Churn = o.churn
	}
	if n > 20000 {
		co.PureBuilds = 1
	}
	cr, err := measureControl(r.ctx, r.p, l.Node, co)
	if r.ctx.Err() != nil {
		return false, r.ctx.Err()
	}
	switch {
	case err != nil:
		r.fail(err)
		r.closeLab(l)
	case dataPlane:
		r.dps = append(r.dps, &dataPlaneLab{n: n, ruleset: rulesetOurs, lab: l})
		fallthrough
	default:
		if o.phases["control"] {
			r.res.Control = append(r.res.Control, cr)
		}
		if !dataPlane {
			r.closeLab(l)
		}
	}
	return true, nil
}

// baselinePhase measures kube-proxy's iptables rules at size n in a new lab, kept
// for the data plane when dataPlane. It reports false when the lab could not be
// made, which ends the size.
func (r *benchRun) baselinePhase(n int, dataPlane bool) (bool, error) {
	o := r.o
	r.p.setPhase("baseline/iptables-%s N=%s", o.backend, short(n))
	l, err := newBenchLab()
	if err != nil {
		r.fail(fmt.Errorf("baseline N=%d: lab: %w", n, err))
		return false, nil
	}
	r.labs = append(r.labs, l)
	bo := baselineOptions{N: n, Backend: o.backend, Updates: o.updates, Seed: o.seed,
		Budget: o.budget, Timeout: o.restoreTimeout, Target: withTarget}
	br, err := measureBaseline(r.ctx, r.p, l.Node, bo)
	if r.ctx.Err() != nil {
		return false, r.ctx.Err()
	}
	if err != nil {
		r.fail(err)
		r.closeLab(l)
		return true, nil
	}
	r.res.Baseline = append(r.res.Baseline, br)
	if dataPlane && br.Full.TotalMs >= 0 {
		r.dps = append(r.dps, &dataPlaneLab{n: n, ruleset: rulesetIptables, lab: l})
	} else {
		r.closeLab(l)
	}
	return true, nil
}

// nftBaselinePhase measures kube-proxy's rules through iptables-nft at size n,
// beside the legacy backend.
func (r *benchRun) nftBaselinePhase(n int) error {
	o := r.o
	r.p.setPhase("baseline/iptables-nft N=%s", short(n))
	if _, err := exec.LookPath(restoreBinary(backendNFT)); err != nil {
		r.fail(fmt.Errorf("baseline: %s not found: %w", restoreBinary(backendNFT), err))
	} else if br, err := measureBaselineNS(r.ctx, r.p, baselineOptions{N: n, Backend: backendNFT, Updates: o.updates,
		Seed: o.seed, Budget: o.budget / 4, Timeout: o.restoreTimeout}); err != nil {
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		r.fail(err)
	} else {
		r.res.Baseline = append(r.res.Baseline, br)
	}
	return nil
}

// dataPlanePhase measures connection latency through the labs kept for it, then
// removes them.
func (r *benchRun) dataPlanePhase() error {
	if len(r.dps) == 0 {
		return nil
	}
	r.p.setPhase("data plane, %d connects per ruleset", r.o.connects)
	dr, err := measureDataPlane(r.ctx, r.p, r.dps, r.o.connects, r.o.warmup)
	if r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	if err != nil {
		r.fail(err)
	}
	r.res.DataPlane = dr
	for _, d := range dr {
		r.p.printf("%s N=%s: p50 %.1f us, p99 %.1f us (%d connects, %d failed)", d.Ruleset, short(d.N), d.Micros.P50, d.Micros.P99, d.Connects, d.Failures)
	}
	for _, d := range r.dps {
		r.closeLab(d.lab)
	}
	return nil
}

// simPhase measures compiling our ruleset into the simulator and tracing through it.
func (r *benchRun) simPhase() error {
	o := r.o
	if !o.phases["sim"] || len(o.simSizes) == 0 {
		return nil
	}
	r.p.setPhase("simulator")
	var subjects []*simSubject
	for _, n := range o.simSizes {
		r.p.printf("compiling our ruleset for N=%s", short(n))
		s, err := compileSim(n)
		if err != nil {
			r.fail(err)
			continue
		}
		subjects = append(subjects, s)
	}
	if len(subjects) == 0 {
		return nil
	}
	r.p.printf("tracing for %s", o.simTime)
	sr, err := measureSim(r.ctx, subjects, o.simTime)
	if r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	if err != nil {
		r.fail(err)
	}
	r.res.Sim = sr
	for _, s := range sr {
		r.p.printf("N=%s: compile %.2fs, %.0f ns per trace (p50 of %d)", short(s.N), s.CompileS, s.NsPerTrace.P50, s.Traces)
	}
	return nil
}

// measureBaselineNS measures the baseline in a plain fresh namespace of its own.
func measureBaselineNS(ctx context.Context, p *progress, o baselineOptions) (*BaselineResult, error) {
	ns, err := lab.NewNS(fmt.Sprintf("%sbench-%d-%s", lab.NamePrefix, os.Getpid(), o.Backend))
	if err != nil {
		return nil, fmt.Errorf("baseline N=%d: namespace: %w", o.N, err)
	}
	defer ns.Close()
	return measureBaseline(ctx, p, ns, o)
}

func meta(o options) Meta {
	m := Meta{
		Started: time.Now(), Quick: o.quick, CPUs: runtime.NumCPU(), Go: runtime.Version(),
		Command: strings.TrimSpace("bench " + strings.Join(o.args, " ")), Path: newApplier(nil, rulesetConfig()).path(),
		Baseline: restoreBinary(o.backend), IptablesLegacy: iptablesVersion(backendLegacy), IptablesNFT: iptablesVersion(backendNFT),
		EndpointsPerService: o.endpoints, NFTBaselineMax: o.nftMax,
		RSSMeasuredBy: "VmHWM of a child process (tools/bench child-control) that generates the cluster and syncs it; nft: getrusage(RUSAGE_CHILDREN) ru_maxrss",
	}
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("nft", "--version").Output(); err == nil {
		m.Nft = strings.TrimSpace(string(out))
	}
	return m
}
