package sim

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nftproxy/nftproxy/packet"
)

func TestTraceErrors(t *testing.T) {
	p := mustCompile(t, "table ip t { chain c { type filter hook input priority 0; numgen random mod 2 vmap { 0 : accept, 1 : drop } } }")
	var te *TraceError
	if _, err := p.Trace(packet.Packet{Protocol: packet.TCP}, testEnv); !errors.As(err, &te) {
		t.Errorf("invalid packet: error %v, want *TraceError", err)
	}
	env := testEnv
	env.Select = func(*Trace) int { return 5 }
	if _, err := NewRuntime(p, env).Trace(packet.MustParse("tcp 1.1.1.1:1 -> 192.168.0.2:2 iif eth0")); !errors.As(err, &te) {
		t.Errorf("bad Select: error %v, want *TraceError", err)
	}

	// Too many numgen paths.
	p = mustCompile(t, `table ip t { chain c { type filter hook input priority 0;
		numgen random mod 100 vmap { 0 : accept }
		numgen random mod 100 vmap { 0 : accept }
	} }`)
	_, err := p.Trace(packet.MustParse("tcp 1.1.1.1:1 -> 192.168.0.2:2 iif eth0"), testEnv)
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "more than 4096 branches") {
		t.Errorf("branch explosion: error %v", err)
	}

	// Jumps deeper than the kernel's jump stack.
	var b strings.Builder
	b.WriteString("table ip t {\n chain c { type filter hook input priority 0; jump a0 }\n")
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&b, " chain a%d { jump a%d }\n", i, i+1)
	}
	b.WriteString(" chain a20 { drop }\n}\n")
	_, err = mustCompile(t, b.String()).Trace(packet.MustParse("tcp 1.1.1.1:1 -> 192.168.0.2:2 iif eth0"), testEnv)
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "jump stack deeper than 16") {
		t.Errorf("deep jumps: error %v", err)
	}
}

// TestConcurrentTraces runs one Program on many goroutines, and one Runtime from many
// goroutines (run with -race to check).
func TestConcurrentTraces(t *testing.T) {
	p := loadGolden(t, "nftproxy")["dump"]
	rt := NewRuntime(p, nodeEnv)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				pkt := packet.MustParse(fmt.Sprintf("tcp 10.3.%d.%d:40000 -> 172.30.0.70:80 iif eth0", g, i))
				if _, err := p.Trace(pkt, nodeEnv); err != nil {
					t.Error(err)
				}
				if _, err := rt.Trace(pkt); err != nil {
					t.Error(err)
				}
			}
		}(g)
	}
	wg.Wait()
	if n := len(rt.Conns()); n != 80 {
		t.Errorf("%d conntrack entries, want 80", n)
	}
}

// TestLoadKeepsState reloads a Runtime with a new version of a ruleset: conntrack
// entries, elements packets added to surviving sets and numgen inc counters carry
// over; elements of a set that is gone do not.
func TestLoadKeepsState(t *testing.T) {
	v1 := `table ip t {
		set keep { type ipv4_addr; flags dynamic; }
		set gone { type ipv4_addr; flags dynamic; }
		chain c { type filter hook prerouting priority 0; policy accept;
			update @keep { ip saddr }
			update @gone { ip saddr }
			numgen inc mod 10 vmap { 0 : continue, 1 : accept, 2 : accept, 3 : accept }
		}
		chain n { type nat hook prerouting priority dstnat; tcp dport 80 dnat to 10.0.0.1 }
	}`
	v2 := `table ip t {
		set keep { type ipv4_addr; flags dynamic; }
		set other { type ipv4_addr; flags dynamic; }
		chain c { type filter hook prerouting priority 0; policy accept;
			ip saddr @keep meta mark set meta mark | 0x1
			ip saddr @other meta mark set meta mark | 0x2
			numgen inc mod 10 vmap { 0 : continue, 1 : accept, 2 : accept, 3 : accept }
			meta mark set meta mark | 0x4
		}
		chain n { type nat hook prerouting priority dstnat; tcp dport 80 dnat to 10.0.0.2 }
	}`
	rt := NewRuntime(mustCompile(t, v1), testEnv)
	pkt := packet.MustParse("tcp 1.1.1.1:5 -> 2.2.2.2:80 iif eth0")
	for i := 0; i < 3; i++ {
		if _, err := rt.Trace(pkt); err != nil {
			t.Fatal(err)
		}
	}
	rt.Load(mustCompile(t, v2))
	if got := rt.SetElements("ip t", "keep"); len(got) != 1 {
		t.Errorf("@keep after Load = %v", got)
	}
	// numgen inc is at 3 (continue-less value 3: accept, so no 0x4); @keep matches,
	// @other is new and empty; the connection keeps its old DNAT.
	tr, err := rt.Trace(pkt)
	if err != nil {
		t.Fatal(err)
	}
	o := tr.Branches[0].Outcome
	if o.Packet.Mark != 0x1 || o.Packet.Dst.String() != "10.0.0.1:80" {
		t.Errorf("after Load: mark %#x dst %s, want 0x1 10.0.0.1:80\n%s", o.Packet.Mark, o.Packet.Dst, tr)
	}
	// A new connection sees the new NAT rule; the counter moved on to 4 (continue).
	tr, _ = rt.Trace(packet.MustParse("tcp 1.1.1.1:6 -> 2.2.2.2:80 iif eth0"))
	if o := tr.Branches[0].Outcome; o.Packet.Dst.String() != "10.0.0.2:80" || o.Packet.Mark != 0x5 {
		t.Errorf("new connection after Load: mark %#x dst %s\n%s", o.Packet.Mark, o.Packet.Dst, tr)
	}
}
