package sim

import (
	"slices"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/packet"
)

func TestTakeAndPutElements(t *testing.T) {
	src := `table ip t {
		set a { type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 3h; }
		set b { type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 3h; }
		set m { type ipv4_addr; flags dynamic; }
		chain c { type filter hook prerouting priority 0; policy accept;
			update @a { ip saddr . ip daddr . meta l4proto . th dport timeout 60s }
		}
	}`
	clock := NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	env := testEnv
	env.Clock = clock
	rt := NewRuntime(mustCompile(t, src), env)
	for _, p := range []string{"tcp 1.1.1.1:5 -> 2.2.2.2:80 iif eth0", "tcp 1.1.1.2:5 -> 2.2.2.2:80 iif eth0", "tcp 1.1.1.1:5 -> 3.3.3.3:80 iif eth0"} {
		if _, err := rt.Trace(packet.MustParse(p)); err != nil {
			t.Fatal(err)
		}
	}
	toDst := func(dst string) func([]string) bool {
		return func(f []string) bool { return len(f) == 4 && f[1] == dst && f[2] == "tcp" && f[3] == "80" }
	}
	taken := rt.TakeElements("ip t", "a", toDst("2.2.2.2"))
	if taken.Len() != 2 {
		t.Fatalf("took %d elements, want 2", taken.Len())
	}
	if got, want := rt.SetElements("ip t", "a"), []string{"1.1.1.1 . 3.3.3.3 . tcp . 80"}; !slices.Equal(got, want) {
		t.Errorf("@a after the take = %v, want %v", got, want)
	}
	// Set a may be gone after a Load; what was taken can still be put elsewhere.
	rt.Load(mustCompile(t, `table ip t {
		set b { type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 3h; }
		set m { type ipv4_addr; flags dynamic; }
	}`))
	if err := rt.PutElements("ip t", "b", taken, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := rt.SetElements("ip t", "b"), []string{"1.1.1.1 . 2.2.2.2 . tcp . 80", "1.1.1.2 . 2.2.2.2 . tcp . 80"}; !slices.Equal(got, want) {
		t.Errorf("@b after the put = %v, want %v", got, want)
	}
	// The put elements carry the given timeout.
	clock.Advance(11 * time.Second)
	if got := rt.SetElements("ip t", "b"); len(got) != 0 {
		t.Errorf("@b 11s after a put with a 10s timeout = %v, want empty", got)
	}
	if err := rt.PutElements("ip t", "m", taken, 0); err == nil {
		t.Error("put into a set of another type: no error")
	}
	if err := rt.PutElements("ip t", "nope", taken, 0); err == nil {
		t.Error("put into a missing set: no error")
	}
	if got := rt.TakeElements("ip t", "a", toDst("3.3.3.3")); got.Len() != 0 {
		t.Errorf("took %d elements from a set that is gone, want 0", got.Len())
	}
}
