package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	file := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run the test with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (review the diff, then run with -update):\ngot:\n%s\nwant:\n%s", file, got, want)
	}
}

// outputPackets are a forked, a masqueraded and a rejected packet of the example.
var outputPackets = []string{
	"tcp 10.1.0.20:40000 -> 172.30.0.10:80 iif veth1",
	"tcp 192.168.0.10:40000 -> 172.30.0.10:80",
	"tcp 10.1.0.20:40001 -> 172.30.0.10:81 iif veth1",
}

func runOut(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if err := run(append(append(exampleCIDRs, "--cluster", cluster), args...), &out, &errb); err != nil {
		t.Fatalf("nftrace %q: %v\nstderr: %s", args, err, errb.String())
	}
	return out.String()
}

// TestSummaryOutput: -o summary prints one line per packet (and per advance of a
// sequence): the packet, the verdict, the endpoints and masquerading.
func TestSummaryOutput(t *testing.T) {
	got := runOut(t, append([]string{"-o", "summary"}, outputPackets...)...)
	got += runOut(t, "-o", "summary", "--sequence", "tcp 10.1.0.20:40000 -> 172.30.0.14:80 iif veth1",
		"advance 1m", "tcp 10.1.0.20:40001 -> 172.30.0.14:80 iif veth1")
	golden(t, "summary.txt", got)
	// Forks whose outcomes agree (ufw's log limit before its drop) are said once.
	var out, errb bytes.Buffer
	if err := run([]string{"-o", "summary", "--ruleset", "../../sim/testdata/ufw-podman.list.nft", "--local", "192.168.0.2",
		"tcp 1.2.3.4:5555 -> 192.168.0.2:8080 iif eth0", "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0"}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	got = out.String()
	want := "tcp 1.2.3.4:5555 -> 192.168.0.2:8080 iif eth0 => DROP in every case (under limit rate 3/minute burst 10 packets; over limit rate 3/minute burst 10 packets)\n" +
		"tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0 => ACCEPT (local)\n"
	if got != want {
		t.Errorf("summary of agreeing forks:\n got: %s\nwant: %s", got, want)
	}
}

// TestDotOutput: -o dot draws each packet's path, hooks → chains → matched rules →
// outcome, the fork's edges labelled with their probability; the graph is one
// digraph for Graphviz.
func TestDotOutput(t *testing.T) {
	got := runOut(t, "-o", "dot", outputPackets[0], outputPackets[2])
	for _, want := range []string{"digraph nftrace {", "subgraph cluster_1 {", "subgraph cluster_2 {",
		`label="hook prerouting"`, `label="chain dnat-2\nip nftproxy"`, `[label="50%"]`, `label="REJECT", shape=box, style="filled,bold", fillcolor="#f4cccc"`} {
		if !strings.Contains(got, want) {
			t.Errorf("dot output lacks %q", want)
		}
	}
	if strings.Count(got, "digraph") != 1 || !strings.HasSuffix(got, "}\n") {
		t.Errorf("dot output is not one digraph:\n%s", got)
	}
	golden(t, "path.dot", got)
}

// TestJSONLines: --json (and -o json) print one compact JSON object per line.
func TestJSONLines(t *testing.T) {
	for _, flagArgs := range [][]string{{"--json"}, {"-o", "json"}} {
		got := runOut(t, append(flagArgs, outputPackets...)...)
		lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
		if len(lines) != len(outputPackets) {
			t.Fatalf("%q: %d lines, want one per packet:\n%s", flagArgs, len(lines), got)
		}
		for i, l := range lines {
			var r Result
			if err := json.Unmarshal([]byte(l), &r); err != nil || r.Packet != outputPackets[i] {
				t.Errorf("%q: line %d %.80q: %v, packet %q", flagArgs, i+1, l, err, r.Packet)
			}
		}
	}
}

// TestHelpAndFlags: --help prints the usage on stdout and is no error; flags that
// take no argument show none, the others name theirs (VALUE for a ruleset flag
// argNames does not know yet); bad output choices are errors.
func TestHelpAndFlags(t *testing.T) {
	for _, h := range []string{"--help", "-h"} {
		var out, errb bytes.Buffer
		if err := run([]string{h}, &out, &errb); err != nil {
			t.Errorf("%s: %v", h, err)
		}
		if !strings.HasPrefix(out.String(), "usage: nftrace ") || errb.Len() != 0 {
			t.Errorf("%s: stdout %.40q, stderr %q; want the usage on stdout", h, out.String(), errb.String())
		}
		if h != "--help" {
			continue
		}
		text := out.String()
		fs := newFlagSet(&options{}, io.Discard)
		fs.VisitAll(func(f *flag.Flag) {
			prefix := "--"
			if len(f.Name) == 1 {
				prefix = "-"
			}
			line := "\n  " + prefix + f.Name
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				if !strings.Contains(text, line+"\n") {
					t.Errorf("boolean flag %s: usage line does not stand alone:\n%s", f.Name, text)
				}
			} else if arg := cmp.Or(argNames[f.Name], "VALUE"); !strings.Contains(text, line+" "+arg+"\n") {
				t.Errorf("flag %s: usage line lacks its argument %s", f.Name, arg)
			}
		})
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "yaml"}, "-o yaml: want text, summary, json or dot"},
		{[]string{"--json", "-o", "dot"}, "--json and -o dot: give one"},
	} {
		var out, errb bytes.Buffer
		if err := run(append(tc.args, "--cluster", cluster, outputPackets[0]), &out, &errb); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
