package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux
// architecture Go runs on (the kernel's own HZ may differ, the ABI does not).
const clockTicks = 100

// procCPU is the CPU time of a process from /proc/PID/stat: its own user and system
// time, and that of the children it has waited for (cutime, cstime), which is where the
// nft, iptables-restore and iptables-save processes a proxy runs are counted.
type procCPU struct {
	Self, Children float64 // seconds
}

// Total is the process's own CPU time and its waited-for children's.
func (c procCPU) Total() float64 { return c.Self + c.Children }

// sub returns the CPU used between b and c.
func (c procCPU) sub(b procCPU) procCPU {
	return procCPU{Self: c.Self - b.Self, Children: c.Children - b.Children}
}

// parseProcStat parses the contents of /proc/PID/stat. The command name (field 2) is in
// parentheses and may hold spaces and parentheses itself, so the fields are counted from
// the last ')'.
func parseProcStat(data string) (procCPU, error) {
	i := strings.LastIndexByte(data, ')')
	if i < 0 {
		return procCPU{}, fmt.Errorf("/proc stat %q: no command name", trimTo(data, 40))
	}
	// After ')' come field 3 (state) on; utime..cstime are fields 14..17.
	f := strings.Fields(data[i+1:])
	if len(f) < 15 {
		return procCPU{}, fmt.Errorf("/proc stat: %d fields after the command name, want at least 15", len(f))
	}
	var t [4]float64
	for k := range t {
		v, err := strconv.ParseUint(f[11+k], 10, 64)
		if err != nil {
			return procCPU{}, fmt.Errorf("/proc stat field %d %q: %w", 14+k, f[11+k], err)
		}
		t[k] = float64(v) / clockTicks
	}
	return procCPU{Self: t[0] + t[1], Children: t[2] + t[3]}, nil
}

// readProcCPU reads the CPU time of process pid.
func readProcCPU(pid int) (procCPU, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procCPU{}, err
	}
	c, err := parseProcStat(string(data))
	if err != nil {
		return procCPU{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return c, nil
}

// parseStatusKB returns the value, in MB, of a "<key>:  <n> kB" line of /proc/PID/status.
func parseStatusKB(data, key string) (float64, error) {
	for _, line := range strings.Split(data, "\n") {
		rest, ok := strings.CutPrefix(line, key+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc status %s: %q, want \"<n> kB\"", key, strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc status %s: %w", key, err)
		}
		return float64(kb) / 1024, nil
	}
	return 0, fmt.Errorf("/proc status: no %s line", key)
}

// readPeakRSS returns VmHWM of process pid in MB.
func readPeakRSS(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	mb, err := parseStatusKB(string(data), "VmHWM")
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return mb, nil
}

// cpuModel returns the CPU's model name from /proc/cpuinfo, or "".
func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func trimTo(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
