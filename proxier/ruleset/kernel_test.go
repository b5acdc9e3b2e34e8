package ruleset

import (
	"os"
	"os/exec"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/internal/testenv"
)

// TestGoldensLoadIntoKernel feeds every golden to the real nft in a fresh network
// namespace: the Fake accepts rules the kernel would refuse (a wrong keyword, a
// verdict not allowed in a hook, a name too long), so the goldens are only a spec
// if the kernel takes them. nft never runs in the machine's own namespace.
func TestGoldensLoadIntoKernel(t *testing.T) {
	requireNetnsNFT(t)
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			path := goldenPath(g.name)
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			loadInNetns(t, path)
		})
	}
}

// TestBuildLoadsIntoKernel loads Build's output for a cluster with every feature at
// once, both families, into the real kernel, checking that the features' objects
// also coexist.
func TestBuildLoadsIntoKernel(t *testing.T) {
	requireNetnsNFT(t)
	st, cfg := everything(t)
	dump := dumpRulesets(t, cfg.Table, dual, func(f knftables.Family) *Ruleset { return Build(st, cfg, f) })
	path := t.TempDir() + "/everything.nft"
	if err := os.WriteFile(path, []byte(dump), 0o644); err != nil {
		t.Fatal(err)
	}
	loadInNetns(t, path)
}

// requireNetnsNFT skips the test unless it can run nft inside a new network
// namespace: that takes root, unshare and nft.
func requireNetnsNFT(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "unshare", "nft")
}

// loadInNetns runs "nft -f path" in a new, empty network namespace that vanishes
// with the process, and fails the test with nft's complaint if it refuses the file.
func loadInNetns(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command("unshare", "--net", "nft", "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("unshare --net nft -f %s: %v\n%s", path, err, out)
	}
}
