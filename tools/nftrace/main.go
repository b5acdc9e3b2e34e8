// Command nftrace shows, hop by hop, what an nftables ruleset does to a packet: the
// ruleset nftproxy builds for a cluster file or a live cluster's API server, a saved
// `nft list ruleset` dump, or the live ruleset of the network namespace it runs in.
// Installed as kubectl-nftrace it is a kubectl plugin (`kubectl nftrace`), tracing
// the cluster of kubectl's configuration by default.
package main

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/packet"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/sim"
)

func main() {
	if err := runAs(isPlugin(os.Args[0]), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "nftrace:", err)
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	cluster     string
	kubeconfig  string
	kubeContext string
	// plugin says nftrace runs as kubectl-nftrace: without another source, it
	// reads the API server of kubectl's configuration.
	plugin bool
	// apiServer says the cluster is read from an API server (--kubeconfig,
	// --context, or the plugin's default).
	apiServer    bool
	node         string
	config       string
	rulesetFile  string
	live         bool
	local        string
	jsonOut      bool
	output       string
	color        string
	printRuleset bool
	sequence     bool
	seed         uint64
	// assume are the --assume pins: the outcomes kept of forks on what a packet
	// cannot decide.
	assume pins
	// rs are the ruleset's settings: --config's, overridden by the flags given, and
	// for --cluster completed from the cluster file (readCluster).
	rs ruleset.Options
	// cfg is the ruleset configuration for --cluster, resolved from rs; warnings say
	// what it leaves unknown (nftrace prints its own, naming what the cluster file
	// may give).
	cfg      ruleset.Config
	warnings []string
}

// newFlagSet returns the flag set of nftrace over o, with rs's fields as the
// defaults of the ruleset flags.
func newFlagSet(o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("nftrace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.cluster, "cluster", "", "cluster file: Kubernetes YAML with Services, EndpointSlices, Nodes and ServiceCIDRs (other kinds are skipped)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "read Services, EndpointSlices, Nodes and ServiceCIDRs from the API server of this kubeconfig file (as kubectl: default $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.kubeContext, "context", "", "the kubeconfig context of the API server (default: the current context)")
	fs.StringVar(&o.node, "node", "", "the node whose ruleset is built (default: the cluster's only Node)")
	fs.StringVar(&o.config, "config", "", "the daemon's configuration file (nftproxy's NftproxyConfiguration or kube-proxy's KubeProxyConfiguration) for the ruleset settings; flags override it")
	fs.StringVar(&o.rulesetFile, "ruleset", "", "trace through a ruleset file ('nft list ruleset' output or nft -f syntax); - reads stdin")
	fs.BoolVar(&o.live, "live", false, "trace through the live ruleset of this network namespace (runs 'nft list ruleset')")
	fs.StringVar(&o.local, "local", "", "the node's own addresses, comma separated, for the routing decision (default: the Node's addresses with --cluster, this namespace's with --live)")
	fs.StringVar(&o.output, "o", "text", "output: text (the path, hop by hop), summary (one line per packet), json (JSON Lines, one object per packet) or dot (the path as a Graphviz graph)")
	fs.BoolVar(&o.jsonOut, "json", false, "the same as -o json")
	fs.StringVar(&o.color, "color", "auto", "highlight the deciding rules: auto, always or never")
	fs.BoolVar(&o.printRuleset, "print-ruleset", false, "print the ruleset built for the cluster (nft -f syntax) and exit")
	fs.BoolVar(&o.sequence, "sequence", false, "trace the packets in order on one node, sharing conntrack entries and set elements (affinity); 'advance 10s' between packets lets time pass")
	fs.Uint64Var(&o.seed, "seed", 1, "with --sequence, the seed of the random choice of the branch each packet commits (numgen random)")
	fs.Var(&o.assume, "assume", "keep only the branches that assume this outcome of what a packet cannot decide (repeatable; KEY is one of "+keyNames()+"; e.g. limit=under, xt=continue, xt:physdev=no-match)")
	fs.Usage = func() { usage(fs, o.plugin) }
	o.rs.AddFlags(fs)
	return fs
}

// argNames name the argument of the flags that take one, in the usage text.
var argNames = map[string]string{
	"cluster": "FILE", "config": "FILE", "kubeconfig": "FILE", "context": "NAME", "ruleset": "FILE", "node": "NAME", "local": "ADDR,...",
	"color": "WHEN", "o": "FORMAT", "seed": "N", "cluster-cidr": "CIDR,...", "service-cidr": "CIDR,...",
	"detect-local-mode": "MODE", "pod-interface-name-prefix": "PREFIX", "nodeport-addresses": "CIDR,...",
	"iptables-masquerade-bit": "BIT", "table-name": "NAME", "assume": "KEY[:NAME]=VALUE",
}

// usage prints the usage text: every flag with its argument, if it takes one, and
// its default, if it has one.
func usage(fs *flag.FlagSet, plugin bool) {
	w := fs.Output()
	if plugin {
		fmt.Fprintf(w, "usage: kubectl nftrace [--kubeconfig FILE] [--context NAME] [--node NAME] [flags] PACKET...\n")
		fmt.Fprintf(w, "       kubectl nftrace (--cluster FILE | --ruleset FILE | --live) [flags] PACKET...\n\n")
	} else {
		fmt.Fprintf(w, "usage: nftrace (--cluster FILE | --kubeconfig FILE | --ruleset FILE | --live) [flags] PACKET...\n\n")
	}
	fmt.Fprintf(w, "PACKET is e.g. 'tcp 10.0.0.5:40000 -> 172.30.0.41:80 iif eth0' or 'udp [fd00::5]:53000 -> [fd00::10]:53';\n")
	fmt.Fprintf(w, "with --sequence, 'advance 10s' lets time pass between packets.\n\nflags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		name := "--" + f.Name
		if len(f.Name) == 1 {
			name = "-" + f.Name
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			name += " " + cmp.Or(argNames[f.Name], "VALUE")
		}
		fmt.Fprintf(w, "  %s\n      %s", name, f.Usage)
		if f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

func parseFlags(args []string, stderr io.Writer) (*options, []string, error) {
	return parseFlagsAs(false, args, stderr)
}

// parseFlagsAs parses the flags of nftrace, or with plugin of kubectl-nftrace.
func parseFlagsAs(plugin bool, args []string, stderr io.Writer) (*options, []string, error) {
	o := &options{plugin: plugin}
	fs := newFlagSet(o, stderr)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if o.config != "" {
		// Parse again over the file's values: only the flags given change them.
		rs, err := loadConfigFile(o.config)
		if err != nil {
			return nil, nil, err
		}
		o = &options{rs: rs, plugin: plugin}
		fs = newFlagSet(o, stderr)
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
	}
	if o.jsonOut {
		if o.output != "text" && o.output != "json" {
			return nil, nil, fmt.Errorf("--json and -o %s: give one", o.output)
		}
		o.output = "json"
	}
	if !slices.Contains([]string{"text", "summary", "json", "dot"}, o.output) {
		return nil, nil, fmt.Errorf("-o %s: want text, summary, json or dot", o.output)
	}
	cfg, warnings, err := o.rs.Config()
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	o.cfg, o.warnings = cfg, warnings
	return o, fs.Args(), nil
}

// run runs nftrace. --help prints the usage on stdout and is no error.
func run(args []string, stdout, stderr io.Writer) error {
	return runAs(false, args, stdout, stderr)
}

// runAs runs nftrace, or with plugin kubectl-nftrace.
func runAs(plugin bool, args []string, stdout, stderr io.Writer) error {
	var flagOut bytes.Buffer
	o, pkts, err := parseFlagsAs(plugin, args, &flagOut)
	if errors.Is(err, flag.ErrHelp) {
		_, err := stdout.Write(flagOut.Bytes())
		return err
	}
	stderr.Write(flagOut.Bytes())
	if err != nil {
		return err
	}
	o.apiServer = o.kubeconfig != "" || o.kubeContext != "" ||
		(o.plugin && o.cluster == "" && o.rulesetFile == "" && !o.live)
	sources := 0
	for _, set := range []bool{o.cluster != "", o.apiServer, o.rulesetFile != "", o.live} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return errors.New("give exactly one of --cluster FILE, --kubeconfig FILE (or --context NAME), --ruleset FILE or --live")
	}
	if o.printRuleset && o.cluster == "" && !o.apiServer {
		return errors.New("--print-ruleset needs --cluster or --kubeconfig")
	}
	entries, err := parseEntries(pkts, o.sequence)
	if err != nil {
		return err
	}
	if !o.printRuleset && !slices.ContainsFunc(entries, func(e entry) bool { return e.advance == 0 }) {
		return errors.New("no packet to trace: give one or more PACKET arguments")
	}
	// --local is checked first: for a cluster file without Nodes it makes the Node.
	given, err := parseAddrs(o.local)
	if err != nil {
		return fmt.Errorf("--local: %w", err)
	}
	prog, local, err := load(o, stdout, stderr)
	if err != nil || prog == nil {
		return err
	}
	if o.local != "" {
		local = given
	}
	env := sim.Env{LocalAddrs: local}
	if err := trace(prog, env, entries, o, stdout); err != nil {
		return err
	}
	if u := o.assume.unused(); len(u) > 0 {
		fmt.Fprintf(stderr, "nftrace: note: --assume %s decided no fork of these traces\n", strings.Join(u, ", "))
	}
	return nil
}

// entry is one PACKET argument: a packet, or with --sequence an advance of the
// clock ("advance 10s").
type entry struct {
	pkt packet.Packet
	// advance is the time that passes, when positive; pkt is then unset.
	advance time.Duration
}

// advanceRE matches the pseudo-packet "advance DURATION".
var advanceRE = regexp.MustCompile(`^\s*advance(\s+(.*?))?\s*$`)

// parseEntries parses every PACKET argument, reporting all errors with the column.
// "advance DURATION" is allowed only in a sequence.
func parseEntries(args []string, sequence bool) ([]entry, error) {
	var out []entry
	var errs []error
	for i, a := range args {
		if m := advanceRE.FindStringSubmatch(a); m != nil {
			d, err := time.ParseDuration(m[2])
			switch {
			case !sequence:
				errs = append(errs, fmt.Errorf("packet %d %q: advance needs --sequence", i+1, a))
			case err != nil || d <= 0:
				errs = append(errs, fmt.Errorf("packet %d %q: want advance DURATION, a positive Go duration such as 10s or 5m", i+1, a))
			default:
				out = append(out, entry{advance: d})
			}
			continue
		}
		p, err := packet.Parse(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("packet %d %q: %w", i+1, a, err))
			continue
		}
		out = append(out, entry{pkt: p})
	}
	return out, errors.Join(errs...)
}

func parseAddrs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("invalid address %q", f)
		}
		out = append(out, a)
	}
	return out, nil
}

// forks compiles the rulesets of --ruleset and --live, whole nodes' rulesets
// (firewalld, iptables-nft, Docker): what a packet cannot decide forks the trace,
// each branch saying what it assumes, instead of refusing the ruleset. nftproxy's own
// ruleset (--cluster) compiles strictly, as in the proxier's tests.
var forks = sim.CompileOptions{Forks: true}

// load compiles the ruleset the options name, and returns the node addresses it
// implies. With --print-ruleset it prints the ruleset and returns a nil program.
func load(o *options, stdout, stderr io.Writer) (*sim.Program, []netip.Addr, error) {
	switch {
	case o.cluster != "" || o.apiServer:
		fakes, st, err := buildCluster(o, stderr, nil)
		if err != nil {
			return nil, nil, err
		}
		var text strings.Builder
		for _, f := range fakes {
			text.WriteString(f.Dump())
		}
		if o.printRuleset {
			fmt.Fprint(stdout, text.String())
			return nil, nil, nil
		}
		prog, err := sim.CompileText(text.String())
		if err != nil {
			where := o.cluster
			if o.apiServer {
				where = "node " + st.Node.Name
			}
			return nil, nil, fmt.Errorf("compiling the ruleset built for %s: %w", where, err)
		}
		return prog, st.Node.Addresses, nil
	case o.rulesetFile != "":
		var data []byte
		var err error
		if o.rulesetFile == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(o.rulesetFile)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading the ruleset: %w", err)
		}
		prog, err := sim.CompileTextOptions(string(data), forks)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", o.rulesetFile, err)
		}
		warnUnsupported(prog, stderr)
		warnJSONXt(data, stderr)
		return prog, nil, nil
	default:
		prog, addrs, err := loadLive()
		if err == nil {
			warnUnsupported(prog, stderr)
		}
		return prog, addrs, err
	}
}

// warnUnsupported says which statements of a whole node's ruleset the simulator
// does not know: it traces each as a fork (or, for one that sets something, as not
// applied), labelled "unsupported ...".
func warnUnsupported(prog *sim.Program, stderr io.Writer) {
	for _, u := range prog.Unsupported() {
		fmt.Fprintf(stderr, "nftrace: warning: not understood, traced as a labelled fork: %s\n", u)
	}
}

// warnJSONXt says when a JSON listing holds iptables-nft's rules: nft -j prints their
// matches and targets as bare xt expressions without arguments (a DNAT without its
// address), so every one of them forks, where the text listing carries nft's
// translation of most.
func warnJSONXt(data []byte, stderr io.Writer) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' || !bytes.Contains(data, []byte(`{"xt":`)) {
		return
	}
	fmt.Fprintln(stderr, "nftrace: warning: this JSON listing holds iptables-nft's xt matches and targets, which nft -j prints without their arguments (a DNAT without its address), so each is traced as a fork; `nft list ruleset` (text) carries their translation")
}

// loadLive reads the ruleset of the network namespace nftrace runs in, and the
// addresses of its interfaces.
func loadLive() (*sim.Program, []netip.Addr, error) {
	out, err := exec.Command("nft", "list", "ruleset").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, nil, fmt.Errorf("nft list ruleset: %w", err)
	}
	prog, err := sim.CompileTextOptions(string(out), forks)
	if err != nil {
		return nil, nil, fmt.Errorf("live ruleset: %w", err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, nil, fmt.Errorf("listing this namespace's addresses: %w", err)
	}
	var local []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			local = append(local, p.Addr())
		}
	}
	return prog, local, nil
}
