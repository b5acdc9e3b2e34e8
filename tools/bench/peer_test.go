package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses; utime 250, stime 50, cutime 1000,
	// cstime 200 ticks.
	stat := "4242 (kube (proxy) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 1000 200 20 0 12 0 999 1000000 2000 18446744073709551615"
	c, err := parseProcStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	if c.Self != 3 || c.Children != 12 || c.Total() != 15 {
		t.Errorf("parseProcStat = %+v (total %v), want own 3 s, children 12 s", c, c.Total())
	}
	d := c.sub(procCPU{Self: 1, Children: 2})
	if d.Self != 2 || d.Children != 10 {
		t.Errorf("sub = %+v, want own 2, children 10", d)
	}
	for _, bad := range []string{"4242 kube-proxy S 1", "4242 (kube-proxy) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 ten 50 0 0 20"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

func TestParseStatusKB(t *testing.T) {
	status := "Name:\tkube-proxy\nVmPeak:\t  900000 kB\nVmHWM:\t  262144 kB\nVmRSS:\t  100 kB\n"
	mb, err := parseStatusKB(status, "VmHWM")
	if err != nil || mb != 256 {
		t.Errorf("VmHWM = %v, %v; want 256 MB", mb, err)
	}
	if _, err := parseStatusKB(status, "VmSwap"); err == nil || !strings.Contains(err.Error(), "VmSwap") {
		t.Errorf("missing key: error %v, want one naming VmSwap", err)
	}
	if _, err := parseStatusKB("VmHWM:\t12 MB\n", "VmHWM"); err == nil {
		t.Error("a value not in kB: no error")
	}
}

func TestSummarizePercentiles(t *testing.T) {
	var xs []float64
	for i := 100; i >= 1; i-- {
		xs = append(xs, float64(i))
	}
	s := summarize(xs)
	if s.P50 != 50 || s.P99 != 99 || s.Min != 1 || s.Max != 100 || s.N != 100 {
		t.Errorf("summarize(1..100) = %+v, want p50 50, p99 99, min 1, max 100", s)
	}
	if s := summarize([]float64{7}); s.P50 != 7 || s.P99 != 7 {
		t.Errorf("summarize([7]) = %+v", s)
	}
}

func TestPeerTable(t *testing.T) {
	runs := []*PeerRun{
		{N: 10000, Proxy: "nftproxy", MinSync: "0s", ProgrammedS: 1.5, LatencyMs: Summary{N: 20, P50: 2, P99: 3}, LatenciesMs: []float64{1100, 2},
			Changes: 50, CPU: procCPU{Self: 1, Children: 0.5}, RSSProgrammedMB: 300, RSSEndMB: 350, IdleS: 10},
		{N: 1000, Proxy: "nftproxy", MinSync: "0s", ProgrammedS: 0.2},
		{N: 1000, Proxy: "kube-proxy-nftables", MinSync: "0s", ProgrammedS: 3, ProgrammedCPU: procCPU{Self: 1, Children: 2.5}, Missed: 2, LatencyMs: Summary{N: 18, P50: 400, P99: 600}},
		{N: 1000, Proxy: "kube-proxy-nftables", MinSync: "1s", ProgrammedS: 9},
	}
	got := peerTable(runs, "0s")
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 9 {
		t.Fatalf("table has %d lines, want header, rule and 7 metrics:\n%s", len(lines), got)
	}
	if want := "|  | kube-proxy nftables 1k | nftproxy 1k | nftproxy 10k |"; lines[0] != want {
		t.Errorf("header %q, want %q (by N, then kube-proxy before nftproxy; the 1s run left out)", lines[0], want)
	}
	for _, want := range []string{
		"| start → programmed | 3.00 s | 200 ms | 1.50 s |",
		"| change → reached, p50 / p99 | 400 ms / 600 ms (2 missed) | - | 2.0 ms / 3.0 ms |",
		"| CPU until programmed (own + nft/iptables) | 3.5 s (1.0 + 2.5) | 0.0 s (0.0 + 0.0) | 0.0 s (0.0 + 0.0) |",
		"| of which the first change after the start | - | - | 1.10 s |",
		"| CPU s per 100 changes (own + nft/iptables) | - | - | 3.00 (2.00 + 1.00) |",
		"| peak RSS programmed / after changes | - | - | 300 / 350 MB |",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	md := (&PeerResults{Machine: "AMD EPYC", Iptables: "legacy", Runs: runs}).markdown()
	if !strings.Contains(md, "min-sync-period 0s:") || !strings.Contains(md, "min-sync-period 1s:") {
		t.Errorf("markdown lacks a table per min-sync-period:\n%s", md)
	}
}

func TestPeerFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-peer-proxies=kube-proxy-ipvs"}, "-peer-proxies"},
		{[]string{"-peer-min-sync=-1s"}, "-peer-min-sync"},
		{[]string{"-peer-iptables=both"}, "-peer-iptables"},
		{[]string{"-peer-sizes=0"}, "-peer-sizes"},
	} {
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var o peerOptions
		check := peerFlags(fs, &o)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.want)
		}
	}
	o, err := parseFlags([]string{"--peer", "--peer-min-sync=0s,1s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.peer.enabled || len(o.peer.minSyncs) != 2 || len(o.peer.sizes) != 2 || o.out != "bench-results/peer" {
		t.Errorf("--peer: %+v, out %q; want two sizes, two min-sync-periods, out bench-results/peer", o.peer, o.out)
	}
}
