package testenv

import (
	"os"
	"testing"
)

func TestMissingNamesTheTool(t *testing.T) {
	if os.Geteuid() != 0 {
		if got := Missing(); got == "" {
			t.Fatal("Missing() = \"\" without root")
		}
		return
	}
	if got := Missing("sh"); got != "" {
		t.Errorf("Missing(sh) = %q, want \"\"", got)
	}
	if got, want := Missing("no-such-tool-xyz"), "needs no-such-tool-xyz, which is not on PATH"; got != want {
		t.Errorf("Missing = %q, want %q", got, want)
	}
}
