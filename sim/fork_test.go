package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/packet"
)

// forkProgram wraps rule (followed by "drop") in an inet prerouting chain compiled
// with forks.
func forkProgram(t *testing.T, rule string) *Program {
	t.Helper()
	src := `table inet t {
	chain c {
		type filter hook prerouting priority 0; policy accept;
		` + rule + ` drop
	}
}`
	p, err := CompileTextOptions(src, CompileOptions{Forks: true})
	if err != nil {
		t.Fatalf("CompileTextOptions:\n%s\nerror: %v", src, err)
	}
	return p
}

func TestForks(t *testing.T) {
	const syn = "tcp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0"
	tests := []struct {
		rule string
		// drop and accept are the assumptions of the branch that drops and of the
		// one that accepts.
		drop, accept string
	}{
		{"limit rate 10/second", "under limit rate 10/second", "over limit rate 10/second"},
		{"limit rate over 10/second burst 5 packets", "over limit rate 10/second burst 5 packets", "under limit rate 10/second burst 5 packets"},
		{"limit rate 1 mbytes/second", "under limit rate 1 mbytes/second", "over limit rate 1 mbytes/second"},
		{"quota 100 mbytes", "within quota 100 mbytes", "quota 100 mbytes used up"},
		{"quota over 100 mbytes used 5 mbytes", "quota over 100 mbytes used 5 mbytes exceeded", "not yet quota over 100 mbytes used 5 mbytes"},
		{"ct count over 10", "more than 10 connections counted", "at most 10 connections counted"},
		{"ct count 10", "at most 10 connections counted", "more than 10 connections counted"},
		{"xt match physdev", `xt match "physdev" matches`, `xt match "physdev" does not match`},
		{`xt match "recent"`, `xt match "recent" matches`, `xt match "recent" does not match`},
		{"socket transparent 1", "socket transparent 1 holds", "socket transparent 1 does not hold"},
		{"meta cpu 1", "meta cpu 1 holds", "meta cpu 1 does not hold"},
		{`meta time "2022-01-01 00:00:00"`, `meta time "2022-01-01 00:00:00" holds`, `meta time "2022-01-01 00:00:00" does not hold`},
		{"meta day { Monday, Tuesday }", "meta day { Monday, Tuesday } holds", "meta day { Monday, Tuesday } does not hold"},
		{`meta hour "17:00"-"19:00"`, `meta hour "17:00"-"19:00" holds`, `meta hour "17:00"-"19:00" does not hold`},
		{`meta day { "Monday", "Friday" }`, `meta day { "Monday", "Friday" } holds`, `meta day { "Monday", "Friday" } does not hold`},
		{"meta random & 5 == 1", "meta random & 5 == 1 holds", "meta random & 5 == 1 does not hold"},
		{"meta random & 3 == 1", "", ""}, // a known probability: no assumption
	}
	for _, tt := range tests {
		t.Run(tt.rule, func(t *testing.T) {
			tr := mustTrace(t, forkProgram(t, tt.rule), syn, testEnv)
			if len(tr.Branches) != 2 {
				t.Fatalf("want 2 branches:\n%s", tr)
			}
			got := map[Verdict]string{}
			for _, b := range tr.Branches {
				got[b.Outcome.Verdict] = strings.Join(b.Assumptions(), "; ")
				if tt.drop != "" && b.Probability != 1 {
					t.Errorf("branch %v: probability %v, want 1 (given its assumption)", b.Outcome.Verdict, b.Probability)
				}
			}
			if got[VerdictDrop] != tt.drop || got[VerdictAccept] != tt.accept {
				t.Errorf("assumptions: drop %q, accept %q; want %q, %q\n%s", got[VerdictDrop], got[VerdictAccept], tt.drop, tt.accept, tr)
			}
			if tt.drop != "" && !strings.Contains(tr.String(), "assuming: "+tt.drop) {
				t.Errorf("the rendered trace does not name the assumption %q:\n%s", tt.drop, tr)
			}
		})
	}
}

// TestForksNeedTheOption: by default, what a packet cannot decide is a compile
// error naming the construct.
func TestForksNeedTheOption(t *testing.T) {
	for _, rule := range []string{
		"limit rate 10/second", "quota 100 mbytes", "ct count over 10", "xt match physdev",
		"xt target CHECKSUM", "socket transparent 1", "meta cpu 1", "meta random & 5 == 1",
		`meta hour "17:00"-"19:00"`,
	} {
		_, err := CompileText("table inet t { chain c { " + rule + " accept } }")
		var ce *CompileError
		if !errors.As(err, &ce) || !strings.Contains(ce.Msg, "which a packet cannot show") {
			t.Errorf("%s: error = %v, want a CompileError saying a packet cannot show it", rule, err)
		}
	}
}

func TestXtTargetForksOnDrop(t *testing.T) {
	p, err := CompileTextOptions(`table ip filter {
	chain FORWARD {
		type filter hook forward priority filter; policy accept;
		xt target "MARK"
		ip daddr 1.1.1.1 drop
	}
}`, CompileOptions{Forks: true})
	if err != nil {
		t.Fatal(err)
	}
	tr := mustTrace(t, p, "tcp 10.0.0.5:1 -> 1.1.1.2:2 iif eth0", testEnv)
	got := map[string]Verdict{}
	for _, b := range tr.Branches {
		got[strings.Join(b.Assumptions(), "; ")] = b.Outcome.Verdict
	}
	if len(got) != 2 || got[`xt target "MARK" lets the packet go on`] != VerdictAccept || got[`xt target "MARK" drops the packet`] != VerdictDrop {
		t.Errorf("branches %v\n%s", got, tr)
	}
}

// TestStatistic: iptables-nft writes "-m statistic --mode random --probability P" as
// a meta random comparison; it forks with its probability, also without the option.
func TestStatistic(t *testing.T) {
	p := mustCompile(t, `table ip nat {
	chain PREROUTING {
		type nat hook prerouting priority dstnat; policy accept;
		meta random & 2147483647 < 715827882 counter dnat to 10.1.0.1
		meta random & 2147483647 < 1073741824 counter dnat to 10.1.0.2
		dnat to 10.1.0.3
	}
}`)
	tr := mustTrace(t, p, "tcp 10.0.0.5:1 -> 172.30.0.1:80 iif eth0", testEnv)
	got := map[string]float64{}
	for _, e := range tr.Endpoints() {
		got[e.Addr.Addr().String()] += e.Probability
	}
	for addr, want := range map[string]float64{"10.1.0.1": 1.0 / 3, "10.1.0.2": 1.0 / 3, "10.1.0.3": 1.0 / 3} {
		if d := got[addr] - want; d > 1e-6 || d < -1e-6 {
			t.Errorf("%s: probability %v, want %v\n%s", addr, got[addr], want, tr)
		}
	}
	for _, b := range tr.Branches {
		if len(b.Assumptions()) != 0 {
			t.Errorf("a statistic branch assumes %v", b.Assumptions())
		}
	}
	if !strings.Contains(tr.String(), "choice: meta random & 2147483647 < 715827882 held, probability 0.3333") {
		t.Errorf("the rendered trace lacks the choice:\n%s", tr)
	}
}

// TestSkuidForksForTheNodesPackets: a packet the node sends has a socket whose owner
// it does not show; one from elsewhere has none, and meta skuid does not match it.
func TestSkuidForksForTheNodesPackets(t *testing.T) {
	p := mustCompile(t, `table inet t {
	chain out {
		type filter hook output priority 0; policy accept;
		meta skuid 1000 drop
	}
}`)
	tr := mustTrace(t, p, "tcp 192.168.0.2:1 -> 1.1.1.1:2", testEnv)
	if len(tr.Branches) != 2 {
		t.Fatalf("want 2 branches:\n%s", tr)
	}
	for _, b := range tr.Branches {
		a := b.Assumptions()
		if len(a) != 1 || !strings.Contains(a[0], "sending socket") {
			t.Errorf("assumptions %v", a)
		}
	}
}

// TestAssumptionsAndCommit: a Runtime commits one of the assumed branches; the
// endpoints are grouped by assumptions.
func TestAssumptionsAndCommit(t *testing.T) {
	p := forkProgram(t, "limit rate over 5/second")
	rt := NewRuntime(p, Env{LocalAddrs: testEnv.LocalAddrs, Seed: 3})
	tr, err := rt.Trace(packet.MustParse("udp 10.0.0.5:1 -> 1.1.1.1:2 iif eth0"))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Committed < 0 || tr.Committed >= len(tr.Branches) {
		t.Fatalf("committed %d of %d", tr.Committed, len(tr.Branches))
	}
	eps := tr.Endpoints()
	if len(eps) != 2 || eps[0].Assumptions == "" || eps[0].Assumptions == eps[1].Assumptions || eps[0].Probability != 1 {
		t.Errorf("endpoints %+v", eps)
	}
}

// TestNamedLimitAndQuota: named limit and quota objects compile; the rules that use
// them fork on whether they match (the object, not the rule, says under or over).
func TestNamedLimitAndQuota(t *testing.T) {
	p, err := CompileTextOptions(`table inet t {
	limit lim1 {
		rate 10/second
	}

	quota q1 {
		over 100 mbytes
	}

	chain c {
		type filter hook input priority filter; policy accept;
		limit name "lim1" accept
		quota name "q1" drop
	}
}`, CompileOptions{Forks: true})
	if err != nil {
		t.Fatal(err)
	}
	tr := mustTrace(t, p, "tcp 10.0.0.5:1 -> 192.168.0.2:22 iif eth0", testEnv)
	got := summary(tr)
	want := []string{
		`[limit name "lim1" does not match; quota name "q1" does not match] 1 accept local 192.168.0.2:22`,
		`[limit name "lim1" does not match; quota name "q1" matches] 1 drop none 192.168.0.2:22 at c`,
		`[limit name "lim1" matches] 1 accept local 192.168.0.2:22`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFlowtableAndQueue: a flowtable and "flow add" leave the packet's path alone; a
// queue forks on the verdict of the program reading it.
func TestFlowtableAndQueue(t *testing.T) {
	p, err := CompileTextOptions(`table inet t {
	flowtable ft {
		hook ingress priority filter + 10
		devices = { eth0, eth1 }
	}

	chain forward {
		type filter hook forward priority filter; policy drop;
		ct state established flow add @ft
		ip daddr 1.1.1.1 queue num 3 bypass
		accept
	}
}`, CompileOptions{Forks: true})
	if err != nil {
		t.Fatal(err)
	}
	tr := mustTrace(t, p, "udp 10.0.0.5:1 -> 1.1.1.1:2 iif eth1 ct established", testEnv)
	got := strings.Join(summary(tr), "\n")
	want := "[the program reading queue num 3 bypass accepts the packet] 1 accept forward 1.1.1.1:2\n[the program reading queue num 3 bypass drops the packet] 1 drop none 1.1.1.1:2 at forward"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}
