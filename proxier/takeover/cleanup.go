package takeover

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
)

// Backend names, as logs and the failure metric's label say them.
const (
	BackendNft    = "iptables-nft"
	BackendLegacy = "iptables-legacy"
)

// RunFunc runs the command name with args and stdin, and returns its output
// (stdout and stderr).
type RunFunc func(ctx context.Context, stdin, name string, args ...string) ([]byte, error)

// Config is how Cleanup reaches the node.
type Config struct {
	// Log gets a line per deletion, a warning per failure, and a line per backend
	// that is absent.
	Log *slog.Logger
	// Run runs a command (nil: os/exec); LookPath finds one (nil: exec.LookPath).
	Run      RunFunc
	LookPath func(string) (string, error)
	// Failed, when set, counts a failure of backend in family (IPv4, IPv6).
	Failed func(backend, family string)
}

// Result counts what Cleanup did.
type Result struct {
	Rules, Chains, Failures int
}

// Cleanup removes kube-proxy's iptables-mode rules and chains from both backends and
// both families (see Select). Failures are logged as warnings and counted, and the
// rest goes on; a second run finds nothing left to do.
func Cleanup(ctx context.Context, cfg Config) Result {
	c := &cleaner{Config: cfg}
	if c.Run == nil {
		c.Run = execRun
	}
	if c.LookPath == nil {
		c.LookPath = exec.LookPath
	}
	c.cleanNft(ctx)
	for _, fam := range []struct{ save, restore, family string }{
		{"iptables-legacy-save", "iptables-legacy-restore", "IPv4"},
		{"ip6tables-legacy-save", "ip6tables-legacy-restore", "IPv6"},
	} {
		c.cleanLegacy(ctx, fam.save, fam.restore, fam.family)
	}
	return c.res
}

// execRun runs a command of the node.
func execRun(ctx context.Context, stdin, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = bytes.NewBufferString(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(out))
	}
	return out, nil
}

type cleaner struct {
	Config
	res Result
}

// nftFamilies are iptables-nft's families, with their ip_family label.
var nftFamilies = []struct{ nft, family string }{{"ip", "IPv4"}, {"ip6", "IPv6"}}

// cleanNft removes kube-proxy's chains from iptables-nft's tables.
func (c *cleaner) cleanNft(ctx context.Context) {
	if _, err := c.LookPath("nft"); err != nil {
		c.Log.Warn("nft is not on PATH: kube-proxy's iptables-nft chains, if any, are left", "backend", BackendNft)
		return
	}
	// Each table is listed by name: `nft list tables` reads every table's sets and
	// elements first, nftproxy's own too, so its cost would grow with the cluster,
	// and the cleanup runs in a sync.
	for _, fam := range nftFamilies {
		for _, name := range Tables {
			out, err := c.Run(ctx, "", "nft", "--json", "list", "table", fam.nft, name)
			if err != nil && noSuchTable(out) {
				continue
			}
			var t *Table
			if err == nil {
				t, err = ParseNftJSON(name, out)
			}
			if err != nil {
				c.fail(BackendNft, fam.family, "listing table "+fam.nft+" "+name, err)
				continue
			}
			c.remove(ctx, BackendNft, fam.family, name, Select(t), func(ctx context.Context, o ops) error {
				_, err := c.Run(ctx, nftScript(fam.nft, name, o), "nft", "-f", "-")
				return err
			})
		}
	}
}

// noSuchTable reports whether out, what a failed `nft list table` printed, says that
// the table does not exist.
func noSuchTable(out []byte) bool {
	return bytes.Contains(out, []byte("No such file or directory"))
}

// cleanLegacy removes kube-proxy's chains from one family's iptables-legacy tables.
// iptables-legacy-save without -t dumps only the tables the kernel already has, so a
// node that never used iptables-legacy gets none created.
func (c *cleaner) cleanLegacy(ctx context.Context, save, restore, family string) {
	savePath, err1 := c.LookPath(save)
	restorePath, err2 := c.LookPath(restore)
	if err1 != nil || err2 != nil {
		c.Log.Info(save+" or "+restore+" is not on PATH: kube-proxy's iptables-legacy chains, if any, are left",
			"backend", BackendLegacy, "ip_family", family)
		return
	}
	out, err := c.Run(ctx, "", savePath)
	var tables []*Table
	if err == nil {
		tables, err = ParseSave(string(out))
	}
	if err != nil {
		c.fail(BackendLegacy, family, "listing the tables", err)
		return
	}
	for _, t := range tables {
		if !slices.Contains(Tables, t.Name) {
			continue
		}
		c.remove(ctx, BackendLegacy, family, t.Name, Select(t), func(ctx context.Context, o ops) error {
			_, err := c.Run(ctx, restoreScript(t.Name, o), restorePath, "--noflush", "--wait=5")
			return err
		})
	}
}

// ops are deletions a backend makes in one transaction: rules, then chains flushed,
// then chains deleted.
type ops struct {
	rules        []Rule
	flush, chain []string
}

// remove applies rm to a table in one transaction and logs each deletion. When that
// fails it goes one by one, so that what can be removed is and each failure is named:
// every rule, every chain flushed (which drops the references between them), then
// every chain.
func (c *cleaner) remove(ctx context.Context, backend, family, table string, rm Removal, apply func(context.Context, ops) error) {
	if rm.Empty() {
		return
	}
	log := c.Log.With("backend", backend, "ip_family", family, "table", table)
	err := apply(ctx, ops{rules: rm.Rules, flush: rm.Chains, chain: rm.Chains})
	if err == nil {
		for _, r := range rm.Rules {
			log.Info("deleted kube-proxy's jump", "chain", r.Chain, "target", r.Target)
		}
		for _, ch := range rm.Chains {
			log.Info("deleted kube-proxy's chain", "chain", ch)
		}
		c.res.Rules += len(rm.Rules)
		c.res.Chains += len(rm.Chains)
		return
	}
	c.fail(backend, family, "removing kube-proxy's chains of table "+table+" at once; going one by one", err)
	for _, r := range rm.Rules {
		if err := apply(ctx, ops{rules: []Rule{r}}); err != nil {
			c.fail(backend, family, fmt.Sprintf("deleting the jump %s -> %s of table %s", r.Chain, r.Target, table), err)
			continue
		}
		log.Info("deleted kube-proxy's jump", "chain", r.Chain, "target", r.Target)
		c.res.Rules++
	}
	if err := apply(ctx, ops{flush: rm.Chains}); err != nil {
		c.fail(backend, family, "flushing kube-proxy's chains of table "+table, err)
	}
	for _, ch := range rm.Chains {
		if err := apply(ctx, ops{chain: []string{ch}}); err != nil {
			c.fail(backend, family, "deleting chain "+ch+" of table "+table, err)
			continue
		}
		log.Info("deleted kube-proxy's chain", "chain", ch)
		c.res.Chains++
	}
}

// fail logs a failure as a warning and counts it.
func (c *cleaner) fail(backend, family, what string, err error) {
	c.Log.Warn("kube-proxy's iptables cleanup: "+what, "backend", backend, "ip_family", family, "err", err)
	c.res.Failures++
	if c.Failed != nil {
		c.Failed(backend, family)
	}
}
