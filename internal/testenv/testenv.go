// Package testenv tells the kernel-facing tests whether they can run here: they
// need root, to create network namespaces, and some tools on PATH. They skip,
// with the reason, when they cannot.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// Missing returns why a kernel test cannot run here (not root, or one of tools
// not on PATH), or "" when it can.
func Missing(tools ...string) string {
	if os.Geteuid() != 0 {
		return "needs root to create network namespaces"
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Sprintf("needs %s, which is not on PATH", t)
		}
	}
	return ""
}

// RequireRoot skips tb, saying why, unless it runs as root with tools on PATH.
func RequireRoot(tb testing.TB, tools ...string) {
	tb.Helper()
	if why := Missing(tools...); why != "" {
		tb.Skip("skipping kernel test: " + why)
	}
}
