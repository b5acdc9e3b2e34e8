package syncer

import (
	"os"
	"testing"
)

func TestTuneNFTKeepsTheUsersTunables(t *testing.T) {
	t.Setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
	if TuneNFT() {
		t.Errorf("TuneNFT() = true with GLIBC_TUNABLES set; want false")
	}
	if got := os.Getenv("GLIBC_TUNABLES"); got != "glibc.malloc.arena_max=2" {
		t.Errorf("GLIBC_TUNABLES = %q; want the user's", got)
	}

	os.Unsetenv("GLIBC_TUNABLES") // t.Setenv restores the original value
	if !TuneNFT() {
		t.Errorf("TuneNFT() = false with GLIBC_TUNABLES unset; want true")
	}
	if got := os.Getenv("GLIBC_TUNABLES"); got != NFTTunables {
		t.Errorf("GLIBC_TUNABLES = %q; want %q", got, NFTTunables)
	}
}
