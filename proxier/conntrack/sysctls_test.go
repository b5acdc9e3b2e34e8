package conntrack

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/internal/testenv"
)

func TestMax(t *testing.T) {
	for _, c := range []struct {
		s    Sysctls
		cpus int
		want int
	}{
		{DefaultSysctls, 2, 128 * 1024},        // 64k scaled, raised to Min
		{DefaultSysctls, 8, 256 * 1024},        // scaled
		{DefaultSysctls, 64, 1 << 20},          // capped
		{Sysctls{MaxPerCore: 0, Min: 5}, 4, 0}, // left alone
	} {
		if got := c.s.Max(c.cpus); got != c.want {
			t.Errorf("%+v on %d CPUs: %d, want %d", c.s, c.cpus, got, c.want)
		}
	}
}

// fakeFiles writes sysctl files with the given values into a directory.
func fakeFiles(t *testing.T, global bool, values map[string]string) SysctlFiles {
	t.Helper()
	dir := t.TempDir()
	for name, v := range values {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return SysctlFiles{Dir: dir, Hashsize: filepath.Join(dir, "hashsize"), Global: global}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestApplyAsKubeProxy(t *testing.T) {
	files := fakeFiles(t, true, map[string]string{
		"nf_conntrack_max": "65536", "hashsize": "16384",
		"nf_conntrack_tcp_timeout_established": "432000", "nf_conntrack_tcp_timeout_close_wait": "3600",
		"nf_conntrack_tcp_be_liberal": "0", "nf_conntrack_udp_timeout": "30", "nf_conntrack_udp_timeout_stream": "120",
	})
	s := DefaultSysctls
	s.UDPTimeout, s.TCPBeLiberal = 10*time.Second, true
	changed, err := s.Apply(files, 2)
	if err != nil {
		t.Fatal(err)
	}
	// close_wait is 3600 already; udp_timeout_stream is not asked for.
	want := []string{"nf_conntrack_max=131072", "hashsize=32768", "nf_conntrack_tcp_timeout_established=86400",
		"nf_conntrack_udp_timeout=10", "nf_conntrack_tcp_be_liberal=1"}
	if !slices.Equal(changed, want) {
		t.Errorf("changed %q, want %q", changed, want)
	}
	for name, v := range map[string]string{"nf_conntrack_max": "131072", "hashsize": "32768",
		"nf_conntrack_tcp_timeout_established": "86400", "nf_conntrack_udp_timeout_stream": "120"} {
		if got := read(t, filepath.Join(files.Dir, name)); got != v {
			t.Errorf("%s = %s, want %s", name, got, v)
		}
	}
	// Applied again, nothing changes.
	if changed, err := s.Apply(files, 2); err != nil || len(changed) > 0 {
		t.Errorf("second Apply changed %q (err %v)", changed, err)
	}
}

func TestApplyOnlyRaisesTheMachinesLimits(t *testing.T) {
	files := fakeFiles(t, true, map[string]string{"nf_conntrack_max": "1000000", "hashsize": "262144"})
	changed, err := Sysctls{MaxPerCore: 32 * 1024, Min: 128 * 1024}.Apply(files, 2)
	if err != nil || len(changed) > 0 {
		t.Errorf("lowered the machine's limits: %q, %v", changed, err)
	}
}

func TestApplyOutsideTheMachinesNamespaceLeavesGlobalSettings(t *testing.T) {
	files := fakeFiles(t, false, map[string]string{"nf_conntrack_max": "65536", "hashsize": "16384",
		"nf_conntrack_tcp_timeout_established": "432000"})
	changed, err := DefaultSysctls.Apply(files, 2)
	if err == nil || !strings.Contains(err.Error(), "nf_conntrack_max=131072: not set from a network namespace") {
		t.Errorf("want an error saying nf_conntrack_max is not set here, got %v", err)
	}
	if read(t, filepath.Join(files.Dir, "nf_conntrack_max")) != "65536" || read(t, files.Hashsize) != "16384" {
		t.Error("the machine-wide settings were written")
	}
	if !slices.Equal(changed, []string{"nf_conntrack_tcp_timeout_established=86400"}) {
		t.Errorf("changed %q, want the namespace's established timeout only", changed)
	}
}

func TestApplyGoesOnPastAFailure(t *testing.T) {
	files := fakeFiles(t, true, map[string]string{"nf_conntrack_tcp_timeout_close_wait": "60"})
	// nf_conntrack_max and hashsize are missing: the module is not loaded.
	changed, err := DefaultSysctls.Apply(files, 2)
	if err == nil || !strings.Contains(err.Error(), "nf_conntrack_max") || !strings.Contains(err.Error(), "nf_conntrack_tcp_timeout_established") {
		t.Errorf("want both missing sysctls named, got %v", err)
	}
	if !slices.Equal(changed, []string{"nf_conntrack_tcp_timeout_close_wait=3600"}) {
		t.Errorf("changed %q, want the one that exists", changed)
	}
}

// TestKernelSysctlsInANamespace applies kube-proxy's defaults from a thread in a
// network namespace of its own: the namespace's timeouts change, the machine's
// own namespace keeps its values, and nf_conntrack_max and the hashsize are not
// touched (the hashsize file is a stand-in, so nothing machine-wide could be).
func TestKernelSysctlsInANamespace(t *testing.T) {
	testenv.RequireRoot(t)
	const established = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"
	if _, err := os.Stat(established); err != nil {
		t.Skipf("skipping kernel test: nf_conntrack is not loaded (%v)", err)
	}
	before := read(t, established)
	ns, err := lab.NewNS(lab.NamePrefix + "ctsysctl")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	stand := filepath.Join(t.TempDir(), "hashsize")
	if err := os.WriteFile(stand, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := DefaultSysctls
	s.TCPEstablishedTimeout = 12345 * time.Second
	var changed []string
	var applyErr error
	var global bool
	if err := ns.Do(func() error {
		files := KernelSysctlFiles()
		global = files.Global
		files.Hashsize = stand
		changed, applyErr = s.Apply(files, 2)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if global {
		t.Fatal("a thread in a new namespace was taken for the machine's namespace")
	}
	if applyErr == nil || !strings.Contains(applyErr.Error(), "nf_conntrack_max") {
		t.Errorf("want nf_conntrack_max refused in a namespace, got %v", applyErr)
	}
	if !slices.Contains(changed, "nf_conntrack_tcp_timeout_established=12345") {
		t.Errorf("changed %q: the namespace's established timeout was not set", changed)
	}
	got, err := ns.Sysctl("net.netfilter.nf_conntrack_tcp_timeout_established")
	if err != nil || got != "12345" {
		t.Errorf("the namespace's established timeout is %q (%v), want 12345", got, err)
	}
	if after := read(t, established); after != before {
		t.Errorf("the machine's own namespace changed: %s -> %s", before, after)
	}
	if read(t, stand) != "1" {
		t.Error("the hashsize was written from a namespace")
	}
}
