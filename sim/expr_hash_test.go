package sim

import "testing"

// A jhash with its seed is one value; one the kernel seeds (no seed listed, symhash)
// forks into mod branches of equal probability.
func TestHashForks(t *testing.T) {
	for _, tc := range []struct {
		expr     string
		branches int
	}{
		{"jhash ip saddr mod 3 seed 0x1", 1},
		{"jhash ip saddr mod 3", 3},
		{"symhash mod 2 offset 5", 2},
	} {
		prog := mustCompile(t, `table ip t {
	chain c {
		type filter hook prerouting priority 0; policy accept;
		meta mark set `+tc.expr+`
	}
}
`)
		tr := mustTrace(t, prog, "udp 1.2.3.4:5 -> 10.0.0.1:53 iif eth0", Env{})
		if len(tr.Branches) != tc.branches {
			t.Fatalf("%s: %d branches, want %d\n%s", tc.expr, len(tr.Branches), tc.branches, tr)
		}
		marks := map[uint32]bool{}
		for _, b := range tr.Branches {
			if b.Probability != 1/float64(tc.branches) {
				t.Errorf("%s: probability %v, want 1/%d", tc.expr, b.Probability, tc.branches)
			}
			marks[b.Outcome.Packet.Mark] = true
		}
		if len(marks) != tc.branches {
			t.Errorf("%s: marks %v, want %d different", tc.expr, marks, tc.branches)
		}
	}
	// The kernel's jhash of the empty key is its initval mixed with nothing.
	if got := jhash(nil, 0); got != 0xdeadbeef {
		t.Errorf("jhash(nil, 0) = %#x, want 0xdeadbeef", got)
	}
}
