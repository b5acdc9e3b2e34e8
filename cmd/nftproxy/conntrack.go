package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/proxier/conntrack"
)

// ConntrackConfiguration is kube-proxy's conntrack section: the conntrack sysctls
// the daemon sets at start (see conntrack.Sysctls), with kube-proxy's field names,
// flags and defaults. Zero leaves a setting as the node has it.
type ConntrackConfiguration struct {
	// MaxPerCore is nf_conntrack_max per CPU (--conntrack-max-per-core, default
	// 32768; 0 leaves nf_conntrack_max and the hashsize).
	MaxPerCore *int32 `json:"maxPerCore,omitempty"`
	// Min is the least nf_conntrack_max (--conntrack-min, default 131072).
	Min *int32 `json:"min,omitempty"`
	// TCPEstablishedTimeout (--conntrack-tcp-timeout-established, default 24h).
	TCPEstablishedTimeout string `json:"tcpEstablishedTimeout,omitempty"`
	// TCPCloseWaitTimeout (--conntrack-tcp-timeout-close-wait, default 1h).
	TCPCloseWaitTimeout string `json:"tcpCloseWaitTimeout,omitempty"`
	// TCPBeLiberal (--conntrack-tcp-be-liberal).
	TCPBeLiberal bool `json:"tcpBeLiberal,omitempty"`
	// UDPTimeout (--conntrack-udp-timeout) and UDPStreamTimeout
	// (--conntrack-udp-timeout-stream), unset by default.
	UDPTimeout       string `json:"udpTimeout,omitempty"`
	UDPStreamTimeout string `json:"udpStreamTimeout,omitempty"`
}

// defaultConntrack is kube-proxy's defaults.
func defaultConntrack() ConntrackConfiguration {
	d := conntrack.DefaultSysctls
	return ConntrackConfiguration{
		MaxPerCore: &d.MaxPerCore, Min: &d.Min,
		TCPEstablishedTimeout: d.TCPEstablishedTimeout.String(), TCPCloseWaitTimeout: d.TCPCloseWaitTimeout.String(),
	}
}

// addFlags registers kube-proxy's conntrack flags on fs.
func (c *ConntrackConfiguration) addFlags(fs *flag.FlagSet) {
	int32Flag(fs, &c.MaxPerCore, "conntrack-max-per-core", "nf_conntrack_max per CPU (0 leaves nf_conntrack_max as it is)")
	int32Flag(fs, &c.Min, "conntrack-min", "least nf_conntrack_max, whatever --conntrack-max-per-core gives")
	fs.StringVar(&c.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", c.TCPEstablishedTimeout, "conntrack timeout of established TCP connections (0 leaves it)")
	fs.StringVar(&c.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", c.TCPCloseWaitTimeout, "conntrack timeout of TCP connections in CLOSE_WAIT (0 leaves it)")
	fs.BoolVar(&c.TCPBeLiberal, "conntrack-tcp-be-liberal", c.TCPBeLiberal, "mark out-of-window TCP packets INVALID no more")
	fs.StringVar(&c.UDPTimeout, "conntrack-udp-timeout", c.UDPTimeout, "conntrack timeout of unreplied UDP flows (0 leaves it)")
	fs.StringVar(&c.UDPStreamTimeout, "conntrack-udp-timeout-stream", c.UDPStreamTimeout, "conntrack timeout of UDP streams (0 leaves it)")
}

// int32Flag registers a flag that sets *p to a new int32.
func int32Flag(fs *flag.FlagSet, p **int32, name, usage string) {
	fs.Func(name, usage, func(v string) error {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return fmt.Errorf("invalid number %q", v)
		}
		n32 := int32(n)
		*p = &n32
		return nil
	})
}

// sysctls validates c and converts it, naming each invalid field.
func (c ConntrackConfiguration) sysctls() (conntrack.Sysctls, error) {
	var s conntrack.Sysctls
	var errs []error
	for _, n := range []struct {
		field, flag string
		v           *int32
		into        *int32
	}{
		{"conntrack.maxPerCore", "conntrack-max-per-core", c.MaxPerCore, &s.MaxPerCore},
		{"conntrack.min", "conntrack-min", c.Min, &s.Min},
	} {
		if n.v == nil {
			continue
		}
		if *n.v < 0 {
			errs = append(errs, fieldError(n.field, n.flag, "%d: want 0 or more", *n.v))
		}
		*n.into = *n.v
	}
	for _, d := range []struct {
		field, flag, v string
		into           *time.Duration
	}{
		{"conntrack.tcpEstablishedTimeout", "conntrack-tcp-timeout-established", c.TCPEstablishedTimeout, &s.TCPEstablishedTimeout},
		{"conntrack.tcpCloseWaitTimeout", "conntrack-tcp-timeout-close-wait", c.TCPCloseWaitTimeout, &s.TCPCloseWaitTimeout},
		{"conntrack.udpTimeout", "conntrack-udp-timeout", c.UDPTimeout, &s.UDPTimeout},
		{"conntrack.udpStreamTimeout", "conntrack-udp-timeout-stream", c.UDPStreamTimeout, &s.UDPStreamTimeout},
	} {
		if d.v == "" {
			continue
		}
		var err error
		if *d.into, err = parseDuration(d.v, true); err != nil {
			errs = append(errs, fieldError(d.field, d.flag, "%v", err))
		}
	}
	s.TCPBeLiberal = c.TCPBeLiberal
	return s, errors.Join(errs...)
}

// applySysctls sets the kernel's conntrack sysctls, as kube-proxy does at start.
func applySysctls(s conntrack.Sysctls) ([]string, error) {
	return s.Apply(conntrack.KernelSysctlFiles(), onlineCPUs())
}

// onlineCPUs returns the machine's online CPUs: nf_conntrack_max is the machine's,
// so it is sized by them, not by the CPUs this process may use.
func onlineCPUs() int {
	data, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(data)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		switch {
		case !isRange && err1 == nil:
			n++
		case isRange && err1 == nil && err2 == nil && b >= a:
			n += b - a + 1
		default:
			return runtime.NumCPU()
		}
	}
	return max(n, 1)
}
