package takeover

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/internal/testenv"
)

// backendTools are the save and restore commands of each backend and family.
var backendTools = []struct{ save, restore, dump string }{
	{"iptables-nft-save", "iptables-nft-restore", "testdata/kube-proxy-iptables.save"},
	{"ip6tables-nft-save", "ip6tables-nft-restore", "testdata/kube-proxy-ip6tables.save"},
	{"iptables-legacy-save", "iptables-legacy-restore", "testdata/kube-proxy-iptables.save"},
	{"ip6tables-legacy-save", "ip6tables-legacy-restore", "testdata/kube-proxy-ip6tables.save"},
}

// TestCleanupInKernel loads the rules of a kube-proxy iptables-mode node into both
// backends of both families, in a network namespace of its own, and runs Cleanup there:
// none of kube-proxy's chains is left anywhere, the kubelet's and Docker's chains and
// jumps stay, and a second run finds nothing to do.
func TestCleanupInKernel(t *testing.T) {
	testenv.RequireRoot(t, "nft", "iptables-nft-restore", "iptables-legacy-restore", "ip6tables-legacy-restore")
	ns, err := lab.NewNS(fmt.Sprintf("%skpclean-%d", lab.NamePrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ctx := context.Background()
	var loaded []string // the save commands of the backends holding the dump
	for _, b := range backendTools {
		dump, err := os.ReadFile(b.dump)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ns.Exec(ctx, withoutNfacct(string(dump)), b.restore); err != nil {
			if strings.Contains(b.restore, "legacy") {
				// Kernels may be built without the legacy x_tables (IP_NF_IPTABLES_LEGACY).
				t.Logf("not checking %s: the kernel refuses its tables: %v", b.save, err)
				continue
			}
			t.Fatal(err)
		}
		loaded = append(loaded, b.save)
	}
	run := func(ctx context.Context, stdin, name string, args ...string) ([]byte, error) {
		out, err := ns.Exec(ctx, stdin, name, args...)
		return []byte(out), err
	}
	var log strings.Builder
	cfg := Config{Log: slog.New(slog.NewTextHandler(&log, nil)), Run: run}
	res := Cleanup(ctx, cfg)
	if res.Failures != 0 || res.Chains == 0 {
		t.Fatalf("cleanup: %+v, want chains deleted and no failure; log:\n%s", res, log.String())
	}
	for _, save := range loaded {
		checkLeft(t, ns, save)
	}
	if again := Cleanup(ctx, cfg); again != (Result{}) {
		t.Errorf("second cleanup: %+v, want nothing done", again)
	}
	t.Logf("deleted %d jumps and %d chains from %v", res.Rules, res.Chains, loaded)
}

// withoutNfacct drops the rules matching nfacct counters, which kube-proxy creates and
// the namespace lacks.
func withoutNfacct(dump string) string {
	var lines []string
	for _, l := range strings.Split(dump, "\n") {
		if !strings.Contains(l, "nfacct") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// checkLeft fails t unless save's dump holds none of kube-proxy's chains and still
// holds the others' chains and jumps of the testdata.
func checkLeft(t *testing.T, ns *lab.NS, save string) {
	t.Helper()
	out, err := ns.Exec(context.Background(), "", save)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := ParseSave(out)
	if err != nil {
		t.Fatal(err)
	}
	var chains, jumps []string
	for _, tb := range tables {
		for _, c := range tb.Chains {
			if Owned(tb.Name, c) {
				t.Errorf("%s: kube-proxy's chain %s of table %s left", save, c, tb.Name)
			}
			chains = append(chains, tb.Name+" "+c)
		}
		for _, r := range tb.Rules {
			if Owned(tb.Name, r.Target) {
				t.Errorf("%s: rule -A %s %s of table %s left", save, r.Chain, r.Spec, tb.Name)
			}
			jumps = append(jumps, tb.Name+" "+r.Chain+" "+r.Target)
		}
	}
	for _, want := range []string{"nat DOCKER", "nat KUBE-KUBELET-CANARY", "filter KUBE-FIREWALL", "mangle KUBE-KUBELET-CANARY"} {
		if !slices.Contains(chains, want) {
			t.Errorf("%s: chain %s gone; chains left %v", save, want, chains)
		}
	}
	for _, want := range []string{"nat PREROUTING DOCKER", "filter INPUT KUBE-FIREWALL"} {
		if !slices.Contains(jumps, want) {
			t.Errorf("%s: jump %s gone; jumps left %v", save, want, jumps)
		}
	}
}
