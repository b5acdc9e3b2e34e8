package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// Whole nodes' rulesets, as nft lists them (sim's real-world testdata).
const (
	firewalld   = "../../sim/testdata/firewalld.list.nft"
	iptablesNft = "../../sim/testdata/iptables-nft.list.nft"
)

// Assumption labels as the simulator gives them.
const (
	underLimit = "under limit rate 10/minute"
	overLimit  = "over limit rate 10/minute"
	bridged    = `xt match "physdev" matches`
	notBridged = `xt match "physdev" does not match`
)

// Packets of iptables-nft.sh's node (192.168.0.2): a pod to kube-proxy's ClusterIP
// (FORWARD's first rule is xt match physdev), ssh (a limit rate), a DHCP reply to a
// container (xt target CHECKSUM, one stated assumption).
const (
	podToClusterIP = "tcp 10.1.0.9:40000 -> 172.30.0.10:80 iif cni0"
	ssh            = "tcp 1.2.3.4:5555 -> 192.168.0.2:22 iif eth0"
	dhcpReply      = "udp 192.168.0.2:67 -> 172.17.0.2:68 oif docker0"
	richRule       = "tcp 198.51.100.7:5555 -> 192.168.0.2:8080 iif eth0"
)

// cases returns each case of r as "assumptions => verdict endpoints".
func cases(r Result) []string {
	var out []string
	for _, c := range r.Cases {
		s := strings.Join(c.Assumptions, " and ") + " => " + c.Verdict
		for _, e := range c.Endpoints {
			s += " " + e.Address
		}
		out = append(out, s)
	}
	return out
}

// TestRulesetForks: --ruleset compiles whole nodes' rulesets with forks: nothing is
// refused, and what the packet cannot decide is followed both ways, each case named
// by its assumptions.
func TestRulesetForks(t *testing.T) {
	for _, tc := range []struct {
		file, pkt string
		want      []string
	}{
		{firewalld, richRule, []string{underLimit + " => accept", overLimit + " => reject"}},
		{iptablesNft, ssh, []string{underLimit + " => accept", overLimit + " => drop"}},
		{iptablesNft, podToClusterIP, []string{bridged + " => accept 10.1.0.5:8080 10.2.0.5:8080", notBridged + " => drop"}},
		{iptablesNft, dhcpReply, []string{`xt target "CHECKSUM" lets the packet go on (it fills in checksums) => accept`}},
	} {
		res := runJSON(t, "--ruleset", tc.file, "--local", "192.168.0.2", tc.pkt)
		if got := cases(res[0]); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s %s: cases %q, want %q", tc.file, tc.pkt, got, tc.want)
		}
		for _, b := range res[0].Branches {
			if len(b.Assumptions) == 0 {
				t.Errorf("%s %s: a branch to %s assumes nothing", tc.file, tc.pkt, b.Packet)
			}
		}
	}
}

// TestAssumePins: --assume keeps the branches that assume the pinned outcome and
// drops those that contradict it; a pin narrowed to one extension wins over the
// key's, and pins of other forks leave a trace alone.
func TestAssumePins(t *testing.T) {
	for _, tc := range []struct {
		file, pkt string
		assume    []string
		want      []string
	}{
		{firewalld, richRule, []string{"limit=under"}, []string{underLimit + " => accept"}},
		{firewalld, richRule, []string{"limit=over"}, []string{overLimit + " => reject"}},
		{iptablesNft, ssh, []string{"limit=under", "xt=continue"}, []string{underLimit + " => accept"}},
		{iptablesNft, podToClusterIP, []string{"limit=under", "xt=continue"}, []string{bridged + " => accept 10.1.0.5:8080 10.2.0.5:8080", notBridged + " => drop"}},
		{iptablesNft, podToClusterIP, []string{"xt=no-match"}, []string{notBridged + " => drop"}},
		{iptablesNft, podToClusterIP, []string{"xt=no-match", "xt:physdev=match"}, []string{bridged + " => accept 10.1.0.5:8080 10.2.0.5:8080"}},
		{iptablesNft, podToClusterIP, []string{"xt:conntrack=no-match"}, []string{bridged + " => accept 10.1.0.5:8080 10.2.0.5:8080", notBridged + " => drop"}},
		{iptablesNft, dhcpReply, []string{"xt=drop"}, []string{`xt target "CHECKSUM" lets the packet go on (it fills in checksums) => accept`}},
	} {
		args := []string{"--ruleset", tc.file, "--local", "192.168.0.2"}
		for _, a := range tc.assume {
			args = append(args, "--assume", a)
		}
		res := runJSON(t, append(args, tc.pkt)...)
		if got := cases(res[0]); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s %s --assume %v: cases %q, want %q", tc.file, tc.pkt, tc.assume, got, tc.want)
		}
	}
	// tproxy, osf and TCP option values: pinned by their own keys.
	const (
		tproxied   = "tcp 1.2.3.4:5555 -> 10.9.0.1:80 iif eth0"
		socket     = "a transparent socket listens on 127.0.0.1:8080"
		noSocket   = "no socket listens on 127.0.0.1:8080"
		notWindows = `osf name "Windows" does not hold`
		tsvalNot0  = "tcp option timestamp tsval 0 does not hold"
	)
	for _, tc := range []struct {
		assume []string
		want   []string
	}{
		{[]string{"osf=no-match", "tcp-option=no-match", "tproxy=socket"}, []string{notWindows + " and " + tsvalNot0 + " and " + socket + " => accept"}},
		{[]string{"osf=no-match", "tcp-option:timestamp=no-match", "tproxy=no-socket"}, []string{notWindows + " and " + tsvalNot0 + " and " + noSocket + " => accept"}},
		{[]string{"osf=match"}, []string{`osf name "Windows" holds => drop`}},
	} {
		args := []string{"--ruleset", "testdata/tproxy.nft", "--local", "192.168.0.2"}
		for _, a := range tc.assume {
			args = append(args, "--assume", a)
		}
		res := runJSON(t, append(args, tproxied)...)
		if got := cases(res[0]); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s --assume %v: cases %q, want %q", tproxied, tc.assume, got, tc.want)
		}
	}
	// One pin decides it all: the verdict is no longer mixed, and the probabilities of
	// the endpoints sum to 1 again.
	res := runJSON(t, "--ruleset", iptablesNft, "--assume", "xt=match", podToClusterIP)
	if r := res[0]; r.Verdict != "accept" || len(r.Endpoints) != 2 || r.Endpoints[0].Probability+r.Endpoints[1].Probability != 1 {
		t.Errorf("--assume xt=match: verdict %s endpoints %+v; want accept to two endpoints summing to 1", r.Verdict, r.Endpoints)
	}
}

// TestAssumeErrors: an unknown key names the accepted ones, an unknown value those
// of its key, and two pins of one fork that contradict each other are refused. A pin
// that decides nothing is noted.
func TestAssumeErrors(t *testing.T) {
	for _, tc := range []struct{ assume, want string }{
		{"limt=under", "unknown key \"limt\"; the keys are limit, quota, ct-count, xt, queue, socket, meta, ether, vlan, arp"},
		{"limit=sideways", "limit takes under, over, match, no-match"},
		{"limit", "want KEY=VALUE"},
		{"limit:foo=under", "limit takes no :NAME"},
		{"limit=under,limit=over", "limit=under and limit=over contradict each other"},
	} {
		var out, errb bytes.Buffer
		err := run([]string{"--ruleset", firewalld, "--assume", tc.assume, richRule}, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--assume %s: error %v, want one containing %q", tc.assume, err, tc.want)
		}
	}
	var out, errb bytes.Buffer
	if err := run([]string{"--ruleset", firewalld, "--local", "192.168.0.2", "--assume", "queue=drop", "-o", "summary", richRule}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if want := "--assume queue=drop decided no fork"; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr %q; want it to contain %q", errb.String(), want)
	}
}

// TestAssumptionsInEveryFormat: text, summary, json and dot each show every branch's
// assumptions, also when --assume leaves one branch.
func TestAssumptionsInEveryFormat(t *testing.T) {
	out := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if err := run(append([]string{"--ruleset", iptablesNft, "--local", "192.168.0.2"}, args...), &out, &errb); err != nil {
			t.Fatalf("nftrace %q: %v\nstderr: %s", args, err, errb.String())
		}
		return out.String()
	}
	text := out(ssh)
	for _, want := range []string{"assuming: " + underLimit, "assuming: " + overLimit, "=> if " + underLimit + ": ACCEPT (local); if " + overLimit + ": DROP"} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}
	if text := out("--assume", "limit=under", ssh); !strings.Contains(text, "assuming: "+underLimit) || strings.Contains(text, overLimit) {
		t.Errorf("text output with --assume limit=under: want the one assumption, not the other:\n%s", text)
	}
	want := ssh + " => if " + underLimit + ": ACCEPT (local); if " + overLimit + ": DROP\n" +
		podToClusterIP + " => if " + bridged + ": ACCEPT (forward) to 10.1.0.5:8080 (50%), 10.2.0.5:8080 (50%); if " + notBridged + ": DROP\n" +
		ssh + " => if " + underLimit + ": ACCEPT (local)\n"
	if got := out("-o", "summary", ssh, podToClusterIP) + out("-o", "summary", "--assume", "limit=under", ssh); got != want {
		t.Errorf("summary:\n%s\nwant:\n%s", got, want)
	}
	dot := out("-o", "dot", podToClusterIP)
	for _, want := range []string{`label="if ` + strings.ReplaceAll(bridged, `"`, `\"`) + `: 50%"`, `label="if ` + strings.ReplaceAll(notBridged, `"`, `\"`) + `"`} {
		if !strings.Contains(dot, want) {
			t.Errorf("dot output lacks %s:\n%s", want, dot)
		}
	}
	res := decodeResults(t, strings.NewReader(out("--json", podToClusterIP)))
	for _, e := range res[0].Endpoints {
		if !reflect.DeepEqual(e.Assumptions, []string{bridged}) || e.Probability != 0.5 {
			t.Errorf("json endpoint %+v; want probability 0.5 assuming %s", e, bridged)
		}
	}
}

// TestAssumeInSequence: in a sequence, the branch the node commits keeps to the
// pins, whatever the seed.
func TestAssumeInSequence(t *testing.T) {
	for seed := range 8 {
		res := runJSON(t, "--ruleset", iptablesNft, "--sequence", "--seed", string(rune('1'+seed)), "--assume", "xt=no-match", podToClusterIP)
		r := res[0]
		if r.Committed == nil || len(r.Branches) != 2 || !reflect.DeepEqual(r.Branches[*r.Committed].Assumptions, []string{notBridged}) {
			t.Fatalf("seed %d: committed %v of %+v; want a branch assuming %s", seed+1, r.Committed, r.Branches, notBridged)
		}
	}
}

// TestClusterStaysStrict: nftproxy's own ruleset is compiled without forks, as in
// the proxier's tests; --assume is accepted there too.
func TestClusterStaysStrict(t *testing.T) {
	res := runJSON(t, append(exampleCIDRs, "--cluster", cluster, "--assume", "limit=under", "tcp 10.1.0.9:40000 -> 172.30.0.10:80 iif veth1")...)
	if len(res[0].Cases) != 0 || res[0].Verdict != "accept" {
		t.Errorf("cluster trace: verdict %s cases %v; want accept without assumptions", res[0].Verdict, res[0].Cases)
	}
}
