package conntrack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Sysctls are the conntrack settings kube-proxy makes at start (its conntrack
// configuration section and --conntrack-* flags), with its meanings: zero leaves
// a setting as the node has it.
type Sysctls struct {
	// MaxPerCore and Min size nf_conntrack_max: MaxPerCore times the node's CPUs
	// (at most 1,048,576), at least Min; it is only ever raised, and the module's
	// hashsize with it to a quarter of it. MaxPerCore 0 leaves both.
	MaxPerCore, Min int32
	// TCPEstablishedTimeout and TCPCloseWaitTimeout are the TCP timeouts.
	TCPEstablishedTimeout, TCPCloseWaitTimeout time.Duration
	// TCPBeLiberal marks out-of-window TCP packets INVALID no more.
	TCPBeLiberal bool
	// UDPTimeout and UDPStreamTimeout are the UDP timeouts.
	UDPTimeout, UDPStreamTimeout time.Duration
}

// DefaultSysctls are kube-proxy v1.37's defaults.
var DefaultSysctls = Sysctls{
	MaxPerCore: 32 * 1024, Min: 128 * 1024,
	TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour,
}

// maxLimit caps nf_conntrack_max, as kube-proxy does on machines of many cores.
const maxLimit = 1 << 20

// SysctlFiles are where the settings are read and written.
type SysctlFiles struct {
	// Dir holds the nf_conntrack_* sysctls. Under /proc/sys they are those of the
	// network namespace of the thread that opens them, except nf_conntrack_max,
	// which is the machine's.
	Dir string
	// Hashsize is the nf_conntrack module's hashsize parameter (the machine's).
	Hashsize string
	// Global allows the machine-wide settings, nf_conntrack_max and the hashsize:
	// only a proxy in the machine's own network namespace (a hostNetwork Pod)
	// makes them, never one in a namespace of its own, such as a test's.
	Global bool
}

// KernelSysctlFiles returns the kernel's files, Global when the calling thread is
// in the machine's first network namespace: the kernel makes nf_conntrack_max
// read-only in every other one, and the thread shares its namespace with the
// process 1 it sees (in a container, the container's own first process).
func KernelSysctlFiles() SysctlFiles {
	const dir = "/proc/sys/net/netfilter"
	return SysctlFiles{
		Dir: dir, Hashsize: "/sys/module/nf_conntrack/parameters/hashsize",
		Global: sameFile("/proc/thread-self/ns/net", "/proc/1/ns/net") && writable(filepath.Join(dir, "nf_conntrack_max")),
	}
}

// writable reports whether the file at path has a write permission bit.
func writable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().Perm()&0o222 != 0
}

// sameFile reports whether a and b are the same file (both readable).
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// Max returns the nf_conntrack_max s asks for on a node of numCPU CPUs, 0 for
// none.
func (s Sysctls) Max(numCPU int) int {
	if s.MaxPerCore <= 0 {
		return 0
	}
	return min(max(int(s.MaxPerCore)*numCPU, int(s.Min)), maxLimit)
}

// Apply writes the settings s makes into files and returns the changes made
// ("nf_conntrack_tcp_timeout_established=86400"). A setting already at its value
// is not written. It goes on past a setting it cannot write and returns every
// failure; the hashsize only follows an nf_conntrack_max that could be set.
func (s Sysctls) Apply(files SysctlFiles, numCPU int) ([]string, error) {
	var changed []string
	var errs []error
	set := func(name string, v int) bool {
		did, err := writeInt(filepath.Join(files.Dir, name), v, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack sysctl %s=%d: %w", name, v, err))
			return false
		}
		if did {
			changed = append(changed, fmt.Sprintf("%s=%d", name, v))
		}
		return true
	}
	if m := s.Max(numCPU); m > 0 && !files.Global {
		errs = append(errs, fmt.Errorf("conntrack sysctl nf_conntrack_max=%d: not set from a network namespace other than the machine's", m))
	} else if m > 0 {
		did, err := writeInt(filepath.Join(files.Dir, "nf_conntrack_max"), m, true)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack sysctl nf_conntrack_max=%d: %w", m, err))
		} else {
			if did {
				changed = append(changed, fmt.Sprintf("nf_conntrack_max=%d", m))
			}
			did, err := writeInt(files.Hashsize, m/4, true)
			if err != nil {
				errs = append(errs, fmt.Errorf("conntrack hashsize=%d: %w", m/4, err))
			} else if did {
				changed = append(changed, fmt.Sprintf("hashsize=%d", m/4))
			}
		}
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{
		{"nf_conntrack_tcp_timeout_established", s.TCPEstablishedTimeout},
		{"nf_conntrack_tcp_timeout_close_wait", s.TCPCloseWaitTimeout},
		{"nf_conntrack_udp_timeout", s.UDPTimeout},
		{"nf_conntrack_udp_timeout_stream", s.UDPStreamTimeout},
	} {
		if t.d > 0 {
			set(t.name, int(t.d/time.Second))
		}
	}
	if s.TCPBeLiberal {
		set("nf_conntrack_tcp_be_liberal", 1)
	}
	return changed, errors.Join(errs...)
}

// writeInt writes v into the file at path unless it holds v already (or, with
// raiseOnly, more); it reports whether it wrote.
func writeInt(path string, v int, raiseOnly bool) (bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return false, fmt.Errorf("%s holds %q: %w", path, strings.TrimSpace(string(data)), err)
	}
	if cur == v || (raiseOnly && cur > v) {
		return false, nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(v)), 0o644); err != nil {
		return false, err
	}
	return true, nil
}
