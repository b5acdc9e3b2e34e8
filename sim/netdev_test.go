package sim

import (
	"strings"
	"testing"
)

// A netdev table's ingress chain runs before prerouting on its devices only; an
// inet ingress chain with a device list likewise; bridge tables are named as not
// traced; arp tables never see IP packets.
func TestIngressAndOtherFamilies(t *testing.T) {
	const src = `table netdev n {
	chain ing {
		type filter hook ingress device "eth0" priority filter; policy accept;
		ip saddr 203.0.113.9 drop
		udp dport 7 fwd to "eth1"
	}
}
table bridge b {
	chain fw {
		type filter hook forward priority filter; policy accept;
		ether type arp accept
	}
}
table arp a {
	chain in {
		type filter hook input priority filter; policy drop;
	}
}
table inet i {
	chain ing {
		type filter hook ingress devices = { eth0, eth2 } priority filter; policy accept;
		udp dport 9 counter
	}
}
`
	prog, err := CompileTextOptions(src, CompileOptions{Forks: true})
	if err != nil {
		t.Fatal(err)
	}
	env := Env{LocalAddrs: realEnv.LocalAddrs}
	for _, tc := range []struct {
		pkt   string
		want  string // Endpoints summary
		steps []string
	}{
		{"udp 203.0.113.9:5 -> 192.168.0.2:9 iif eth0", "drop", []string{"hook ingress", "ip saddr 203.0.113.9 drop", "not traced: bridge b chain fw"}},
		{"udp 203.0.113.9:5 -> 192.168.0.2:9 iif eth1", "accept local", []string{"hook prerouting"}},
		{"udp 198.51.100.1:5 -> 192.168.0.2:9 iif eth2", "accept local", []string{"udp dport 9 counter"}},
		{"udp 198.51.100.1:5 -> 192.168.0.2:7 iif eth0", "accept forward", []string{`fwd to "eth1"`}},
	} {
		tr := mustTrace(t, prog, tc.pkt, env)
		if len(tr.Branches) != 1 {
			t.Fatalf("%s forks:\n%s", tc.pkt, tr)
		}
		o := tr.Branches[0].Outcome
		if got := o.Verdict.String() + " " + o.Delivery.String(); !strings.HasPrefix(strings.TrimSpace(got), tc.want) {
			t.Errorf("%s: %q, want %q\n%s", tc.pkt, got, tc.want, tr)
		}
		for _, s := range tc.steps {
			if !strings.Contains(tr.String(), s) {
				t.Errorf("%s: the trace lacks %q:\n%s", tc.pkt, s, tr)
			}
		}
	}
	if tr := mustTrace(t, prog, "udp 198.51.100.1:5 -> 192.168.0.2:9 iif eth1", env); strings.Contains(tr.String(), "hook ingress") {
		t.Errorf("ingress ran for a device no chain hooks:\n%s", tr)
	}
}
