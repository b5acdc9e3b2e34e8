package sim

import (
	"strings"
	"testing"
)

// What the simulator does not know is, compiled with forks, a labelled fork up to the
// first point from which the rule compiles (the verdict after it still applies), or a
// stated assumption for a statement that sets something; Unsupported names each.
func TestUnknownStatementsFork(t *testing.T) {
	const src = `table inet r {
	chain c {
		type filter hook prerouting priority filter; policy accept;
		ct label set 1
		ipsec in reqid 1 drop
	}
}
`
	if _, err := CompileText(src); err == nil {
		t.Fatal("strict CompileText accepted ct label set")
	}
	prog, err := CompileTextOptions(src, CompileOptions{Forks: true})
	if err != nil {
		t.Fatal(err)
	}
	if u := prog.Unsupported(); len(u) != 2 || !strings.Contains(u[0], `"ct label set 1"`) || !strings.Contains(u[1], `unsupported expression "ipsec"`) {
		t.Errorf("Unsupported() = %q, want ct label set and ipsec", u)
	}
	tr := mustTrace(t, prog, "udp 1.2.3.4:5 -> 10.0.0.1:53 iif eth0", Env{})
	got := map[string]string{}
	for _, b := range tr.Branches {
		got[strings.Join(b.Assumptions(), "; ")] = b.Outcome.Verdict.String()
	}
	want := map[string]string{
		"unsupported ct label set 1 not applied; unsupported ipsec in reqid 1 holds":         "drop",
		"unsupported ct label set 1 not applied; unsupported ipsec in reqid 1 does not hold": "accept",
	}
	if len(got) != len(want) {
		t.Fatalf("branches %q, want %q\n%s", got, want, tr)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("branch %q: %q, want %q\n%s", k, got[k], v, tr)
		}
	}
}
