// Command nftproxy is the Kubernetes Service proxy on nftables: it watches Services,
// EndpointSlices and its Node, and keeps one nftables table per IP family equal to
// what they ask for. Its flags are kube-proxy's where the meaning is the same.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/conntrack"
	"github.com/nftproxy/nftproxy/proxier/syncer"
	"github.com/nftproxy/nftproxy/proxier/takeover"
)

func main() {
	// Every nft the proxier runs inherits malloc tunables that speed up large loads.
	syncer.TuneNFT()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr, defaultDeps())
	stop()
	os.Exit(code)
}

// deps are the daemon's ties to the outside world, replaced in tests.
type deps struct {
	// newNFT opens a family's table (proxier.DefaultNewNFT: the kernel's nft).
	newNFT proxier.NewNFTFunc
	// netlink carries the element batches into newNFT's tables
	// (proxier.KernelNetlink; nil: everything through nft).
	netlink proxier.NetlinkFunc
	// newClient connects to the API server.
	newClient func(o *Options) (kubernetes.Interface, error)
	// conntrack deletes stale conntrack entries (nil: no cleanup).
	conntrack proxier.ConntrackCleaner
	// sysctls sets the conntrack sysctls and returns what it changed (nil: none
	// are set).
	sysctls func(conntrack.Sysctls) ([]string, error)
	// iptablesCleanup removes kube-proxy's iptables-mode rules and chains
	// (takeover.Cleanup; nil: --cleanup-kube-proxy-iptables does nothing, so that no
	// test touches the machine's own iptables).
	iptablesCleanup func(context.Context, takeover.Config) takeover.Result
}

func defaultDeps() deps {
	return deps{newNFT: proxier.DefaultNewNFT, netlink: proxier.KernelNetlink, newClient: newClient, conntrack: conntrack.NewCleaner(), sysctls: applySysctls,
		iptablesCleanup: takeover.Cleanup}
}

// newClient returns a clientset for --master / --kubeconfig, or the in-cluster
// configuration when neither is given.
func newClient(o *Options) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags(o.Master, o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("API server configuration: %w", err)
	}
	cfg.UserAgent = "nftproxy"
	return kubernetes.NewForConfig(cfg)
}

// run is the daemon's body: it returns the process exit code (0, or 1 after a
// configuration or start-up error, which it reports on stderr).
func run(ctx context.Context, args []string, stderr io.Writer, d deps) int {
	opts, err := loadConfig(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stderr, err.Error())
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "nftproxy: %v\n", err)
		return 1
	}
	if opts.Version {
		fmt.Fprintf(stderr, "nftproxy %s\n", buildVersion())
		return 0
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: opts.LogLevel}))
	for _, w := range opts.Warnings {
		log.Warn(w)
	}
	if opts.ConfigWritten != "" {
		log.Info("wrote the configuration", "file", opts.ConfigWritten)
		return 0
	}
	if d.sysctls != nil && !opts.Cleanup {
		changed, err := d.sysctls(opts.Conntrack)
		for _, c := range changed {
			log.Info("set conntrack sysctl", "setting", c)
		}
		if err != nil {
			if opts.InitOnly {
				log.Error("conntrack sysctls", "err", err)
				return 1
			}
			log.Warn("conntrack sysctls not all set", "err", err)
		}
	}
	if opts.InitOnly {
		log.Info("initialized (--init-only)")
		return 0
	}
	if opts.Cleanup {
		if err := proxier.Cleanup(ctx, d.newNFT, opts.Ruleset.Table); err != nil {
			log.Error("cleanup failed", "err", err)
			return 1
		}
		log.Info("removed nftproxy's tables", "table", opts.Ruleset.Table)
		return 0
	}
	if err := runDaemon(ctx, opts, log, d); err != nil {
		log.Error("nftproxy failed", "err", err)
		return 1
	}
	return 0
}

// version is the release, set at link time (-ldflags "-X main.version=v1.2.3");
// without it buildVersion reads the module's build information.
var version string

// buildVersion returns version, or the main module's version and VCS revision.
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			v += " " + s.Value
		}
	}
	return v
}
