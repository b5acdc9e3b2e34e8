package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testenv"
)

// TestCleanupInKernel runs `nftproxy --cleanup` against the real nft, inside a new
// network namespace that vanishes with the shell: our tables go, and a table of
// someone else stays. nft never runs in the machine's own namespace.
func TestCleanupInKernel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	testenv.RequireRoot(t, "unshare", "nft", "sh")
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	script := `set -e
nft add table ip kt-proxy
nft add chain ip kt-proxy services
nft add table ip6 kt-proxy
nft add table ip other
"$1" --cleanup --table-name=kt-proxy --hostname-override=n
echo "--- tables"
nft list tables
`
	out, err := exec.Command("unshare", "--net", "sh", "-c", script, "sh", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("cleanup in a namespace: %v\n%s", err, out)
	}
	_, tables, _ := strings.Cut(string(out), "--- tables\n")
	if strings.Contains(tables, "kt-proxy") || !strings.Contains(tables, "table ip other") {
		t.Errorf("tables after --cleanup:\n%s\nwant only ip other", tables)
	}
}
