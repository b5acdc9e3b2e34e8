package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testenv"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

const cluster = "../../examples/cluster.yaml"

// exampleCIDRs are the pod and Service CIDRs of the example cluster (stated in its
// header): nftrace assumes none.
var exampleCIDRs = []string{"--cluster-cidr", "10.0.0.0/8,fd00::/28", "--service-cidr", "172.30.0.0/16,fd00:30::/108"}

func runJSON(t *testing.T, args ...string) []Result {
	t.Helper()
	var out, errb bytes.Buffer
	if err := run(append([]string{"--json"}, args...), &out, &errb); err != nil {
		t.Fatalf("nftrace %v: %v\nstderr: %s", args, err, errb.String())
	}
	return decodeResults(t, &out)
}

// decodeResults decodes the --json output in out.
func decodeResults(t *testing.T, out io.Reader) []Result {
	t.Helper()
	var res []Result
	dec := json.NewDecoder(out)
	for dec.More() {
		var r Result
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("decoding output: %v", err)
		}
		res = append(res, r)
	}
	return res
}

func addrs(r Result) map[string]float64 {
	m := map[string]float64{}
	for _, e := range r.Endpoints {
		m[e.Address] = e.Probability
	}
	return m
}

func TestClusterTraceJSON(t *testing.T) {
	res := runJSON(t, append(exampleCIDRs, "--cluster", cluster,
		"tcp 10.1.0.9:40000 -> 172.30.0.10:80 iif veth1",
		"tcp 10.1.0.9:40001 -> 172.30.0.10:81 iif veth1",
		"tcp 192.168.0.10:40002 -> 172.30.0.10:80",
	)...)
	if len(res) != 3 {
		t.Fatalf("got %d results, want 3", len(res))
	}
	web := res[0]
	if web.Verdict != "accept" || web.Delivery != "forward" || web.Masquerade {
		t.Errorf("pod -> web: verdict %s delivery %s masquerade %v; want accept forward unmasqueraded", web.Verdict, web.Delivery, web.Masquerade)
	}
	if got := addrs(web); len(got) != 2 || got["10.1.0.5:8080"] != 0.5 || got["10.2.0.5:8080"] != 0.5 {
		t.Errorf("pod -> web endpoints = %v; want 10.1.0.5:8080 and 10.2.0.5:8080 at 0.5 each", got)
	}
	if len(web.Steps) == 0 || web.Steps[0].Kind != "hook" || len(web.Branches) != 2 {
		t.Errorf("pod -> web: %d steps (first %+v), %d branches; want steps starting at a hook and 2 branches", len(web.Steps), web.Steps, len(web.Branches))
	}
	if res[1].Verdict != "reject" || len(res[1].Endpoints) != 0 {
		t.Errorf("pod -> web:81: verdict %s endpoints %v; want reject without endpoints", res[1].Verdict, res[1].Endpoints)
	}
	node := res[2]
	if !node.Masquerade || node.SNAT != "192.168.0.10" || len(node.Endpoints) != 2 {
		t.Errorf("node -> web: masquerade %v snat %q endpoints %v; want masqueraded to 192.168.0.10 over 2 endpoints", node.Masquerade, node.SNAT, node.Endpoints)
	}
}

func TestTextOutputHighlightsTheDecidingRule(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run([]string{"--cluster", cluster, "--color", "always", "tcp 10.1.0.9:40001 -> 172.30.0.10:81 iif veth1"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if !strings.Contains(text, "\x1b[1;33m") || !strings.Contains(text, "=> REJECT") {
		t.Errorf("text output lacks the highlighted rule or the verdict line:\n%s", text)
	}
	out.Reset()
	if err := run([]string{"--cluster", cluster, "--color", "never", "tcp 10.1.0.9:40001 -> 172.30.0.10:81 iif veth1"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Errorf("--color never printed escape codes")
	}
}

func TestRulesetFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "filter.nft")
	rules := `table inet filter {
	chain input {
		type filter hook input priority filter; policy drop;
		ct state established,related accept
		iifname "lo" accept
		tcp dport { 22, 80 } accept
	}
}
`
	if err := os.WriteFile(file, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	res := runJSON(t, "--ruleset", file, "--local", "192.168.0.10",
		"tcp 203.0.113.5:4000 -> 192.168.0.10:22 iif eth0",
		"tcp 203.0.113.5:4001 -> 192.168.0.10:23 iif eth0")
	if res[0].Verdict != "accept" || res[0].Delivery != "local" {
		t.Errorf("ssh: %s/%s, want accept/local", res[0].Verdict, res[0].Delivery)
	}
	if res[1].Verdict != "drop" {
		t.Errorf("telnet: %s, want drop by the input policy", res[1].Verdict)
	}
}

func TestBadInputNamesTheProblem(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster", cluster, "tpc 10.0.0.1:1 -> 10.0.0.2:2"}, `unknown protocol "tpc"`},
		{[]string{"--cluster", cluster, "tcp 10.0.0.1:1 -> 10.0.0.2:99999"}, "column"},
		{[]string{"tcp 10.0.0.1:1 -> 10.0.0.2:2"}, "give exactly one of --cluster"},
		{[]string{"--cluster", cluster}, "no packet to trace"},
		{[]string{"--cluster", "does-not-exist.yaml", "tcp 10.0.0.1:1 -> 10.0.0.2:2"}, "does-not-exist.yaml"},
		{[]string{"--cluster", cluster, "--cluster-cidr", "10.0.0.0/33", "tcp 10.0.0.1:1 -> 10.0.0.2:2"}, `clusterCIDR (--cluster-cidr): invalid CIDR "10.0.0.0/33"`},
		{[]string{"--cluster", cluster, "--local", "1.2.3", "tcp 10.0.0.1:1 -> 10.0.0.2:2"}, `--local: invalid address "1.2.3"`},
	} {
		var out, errb bytes.Buffer
		err := run(tc.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("nftrace %q: error %v; want it to mention %q", tc.args, err, tc.want)
		}
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.nft")
	os.WriteFile(bad, []byte("table ip t {\n\tchain c {\n\t\ttype filter hook prerouting priority 0; policy accept;\n\t\tip daddr 10.0.0.2 frobnicate drop\n\t}\n}\n"), 0o644)
	// A whole node's ruleset is never refused: what the simulator does not know is a
	// labelled fork, and a warning names it.
	var out, errb bytes.Buffer
	err := run([]string{"--ruleset", bad, "-o", "summary", "tcp 10.0.0.1:1 -> 10.0.0.2:2"}, &out, &errb)
	if err != nil || !strings.Contains(errb.String(), `warning: not understood, traced as a labelled fork: table ip t chain c rule 0 "ip daddr 10.0.0.2 frobnicate drop"`) ||
		!strings.Contains(out.String(), "if unsupported frobnicate holds: DROP") {
		t.Errorf("unsupported expression: error %v, stderr %q, stdout %q; want a warning naming the token and a labelled fork", err, errb.String(), out.String())
	}
}

// TestLive traces through a ruleset loaded into a throwaway network namespace.
func TestLive(t *testing.T) {
	testenv.RequireRoot(t, "nft", "unshare")
	bin := filepath.Join(t.TempDir(), "nftrace")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	rules := filepath.Join(t.TempDir(), "r.nft")
	os.WriteFile(rules, []byte("table ip livetest {\n chain pre {\n  type nat hook prerouting priority dstnat; policy accept;\n  ip daddr 172.30.0.1 tcp dport 80 dnat to 10.1.0.7:8080\n }\n}\n"), 0o644)
	script := "nft -f " + rules + " && " + bin + " --live --json 'tcp 203.0.113.5:4000 -> 172.30.0.1:80 iif eth0'"
	out, err := exec.Command("unshare", "-n", "sh", "-c", script).Output()
	if err != nil {
		t.Fatalf("unshare -n: %v", err)
	}
	var r Result
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("decoding %q: %v", out, err)
	}
	if len(r.Endpoints) != 1 || r.Endpoints[0].Address != "10.1.0.7:8080" {
		t.Errorf("live trace endpoints = %v; want 10.1.0.7:8080", r.Endpoints)
	}
}

// TestFlagsGiveTheDaemonsConfig: nftrace's ruleset flags are ruleset.Options',
// giving the Config the daemon and the feature scenarios get for the same settings.
func TestFlagsGiveTheDaemonsConfig(t *testing.T) {
	ro, err := ruleset.DecodeOptions([]byte(`clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
serviceCIDR: 10.96.0.0/12
detectLocalMode: InterfaceNamePrefix
detectLocal: {interfaceNamePrefix: cali}
nodePortAddresses: [192.168.0.0/24]
masqueradeAll: true
masqueradeBit: 9
tableName: kp
`))
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := ro.Config()
	if err != nil {
		t.Fatal(err)
	}
	o, _, err := parseFlags([]string{"--cluster-cidr=10.244.0.0/16,fd00:10:244::/56", "--service-cidr=10.96.0.0/12",
		"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=cali", "--nodeport-addresses=192.168.0.0/24",
		"--masquerade-all", "--iptables-masquerade-bit=9", "--table-name=kp"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.cfg, want) || len(o.warnings) != 0 {
		t.Errorf("nftrace config %+v (warnings %q), want %+v", o.cfg, o.warnings, want)
	}
}

// TestSequence: with --sequence the packets share the node's state. The second
// connection of a client to a ClientIP-affinity Service goes to the endpoint the
// first committed, until the affinity times out (advance: ten minutes after the
// last new connection refreshed it); a packet of an open
// connection follows its conntrack entry; without --sequence each packet is alone.
func TestSequence(t *testing.T) {
	const (
		first  = "tcp 10.1.0.20:40000 -> 172.30.0.14:80 iif veth1"
		second = "tcp 10.1.0.20:40001 -> 172.30.0.14:80 iif veth1"
		third  = "tcp 10.1.0.20:40002 -> 172.30.0.14:80 iif veth1"
		later  = "tcp 10.1.0.20:40003 -> 172.30.0.14:80 iif veth1"
	)
	both := "10.1.0.9:8080,10.2.0.9:8080"
	seen := map[string]bool{}
	for _, seed := range []string{"1", "2", "3", "4", "5", "6"} {
		res := runJSON(t, append(exampleCIDRs, "--cluster", cluster, "--sequence", "--seed", seed,
			first, second, first, "advance 9m", third, "advance 11m", later)...)
		if len(res) != 5 {
			t.Fatalf("seed %s: %d results, want 5 (advance prints none)", seed, len(res))
		}
		if endpointSet(res[0]) != both || res[0].Committed == nil || res[0].Time != "0s" {
			t.Fatalf("seed %s: first connection: endpoints %q committed %v time %q; want both, one committed, at 0s", seed, endpointSet(res[0]), res[0].Committed, res[0].Time)
		}
		sticky := res[0].Branches[*res[0].Committed].DNAT
		seen[sticky] = true
		for i, want := range []string{sticky, sticky, sticky, both} {
			if got := endpointSet(res[i+1]); got != want {
				t.Errorf("seed %s: packet %d (%s): endpoints %q, want %q", seed, i+2, res[i+1].Packet, got, want)
			}
		}
		if res[3].Time != "9m0s" || res[4].Time != "20m0s" {
			t.Errorf("seed %s: times %q, %q; want 9m0s, 20m0s", seed, res[3].Time, res[4].Time)
		}
		var ct bool
		for _, s := range res[2].Steps {
			ct = ct || (s.Kind == "conntrack" && strings.Contains(s.Detail, "established"))
		}
		if !ct {
			t.Errorf("seed %s: the first connection's second packet shows no established conntrack entry: %+v", seed, res[2].Steps)
		}
	}
	if len(seen) != 2 {
		t.Errorf("six seeds committed only %v; want both endpoints among them", seen)
	}
	// Alone, every packet is a first.
	for _, r := range runJSON(t, append(exampleCIDRs, "--cluster", cluster, first, second)...) {
		if endpointSet(r) != both || r.Committed != nil || r.Time != "" {
			t.Errorf("without --sequence %s: endpoints %q committed %v time %q; want both, none committed, no time", r.Packet, endpointSet(r), r.Committed, r.Time)
		}
	}
	var out, errb bytes.Buffer
	if err := run(append(exampleCIDRs, "--cluster", cluster, "--color", "never", "--sequence", first, "advance 1m", second), &out, &errb); err != nil {
		t.Fatal(err)
	}
	if text := out.String(); !strings.Contains(text, "(committed)") || !strings.Contains(text, "; committed branch ") ||
		!strings.Contains(text, "\n\nadvance 1m0s: the clock reads +1m0s\n\n") {
		t.Errorf("text output lacks the committed branch or the advance:\n%s", text)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{first, "advance 10s"}, `packet 2 "advance 10s": advance needs --sequence`},
		{[]string{"--sequence", first, "advance ten"}, `packet 2 "advance ten": want advance DURATION`},
		{[]string{"--sequence", "advance 1s"}, "no packet to trace"},
	} {
		err := run(append([]string{"--cluster", cluster}, tc.args...), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestJSONWithXtWarns: nft -j prints iptables-nft's DNAT as a bare xt target, so the
// JSON listing of such a node traces its translations as forks, and nftrace says to
// give the text listing instead; a JSON listing without xt gets no such warning.
func TestJSONWithXtWarns(t *testing.T) {
	dir := t.TempDir()
	const xt = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "nat", "handle": 1}},
{"chain": {"family": "ip", "table": "nat", "name": "PREROUTING", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"rule": {"family": "ip", "table": "nat", "chain": "PREROUTING", "handle": 2, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"xt": {"type": "target", "name": "DNAT"}}]}}]}`
	plain := strings.Replace(xt, `{"xt": {"type": "target", "name": "DNAT"}}`, `{"accept": null}`, 1)
	for _, tc := range []struct {
		name, ruleset string
		warn          bool
	}{{"xt", xt, true}, {"plain", plain, false}} {
		file := filepath.Join(dir, tc.name+".json")
		if err := os.WriteFile(file, []byte(tc.ruleset), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		if err := run([]string{"--ruleset", file, "-o", "summary", "tcp 10.0.0.1:1000 -> 10.0.0.2:80 iif eth0"}, &out, &errb); err != nil {
			t.Fatalf("%s: %v\n%s", tc.name, err, errb.String())
		}
		if got := strings.Contains(errb.String(), "nft list ruleset"); got != tc.warn {
			t.Errorf("%s: warning to use the text listing: %v, want %v; stderr:\n%s", tc.name, got, tc.warn, errb.String())
		}
		if tc.warn && !strings.Contains(out.String(), `xt target "DNAT"`) {
			t.Errorf("%s: want the DNAT traced as a labelled fork, got %s", tc.name, out.String())
		}
	}
}
