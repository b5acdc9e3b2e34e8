package sim

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testenv"
)

// kernelConstruct is one construct checked against the kernel: its rules loaded in a
// fresh network namespace (lo up), real packets sent on lo by a python script, and
// every counted rule's kernel counter compared with how many of the simulator's
// traces of the same packets match it. Where the construct forks, assume picks, for
// each packet, the one branch whose assumptions contain every string of it: the
// outcome the namespace's setup makes true.
type kernelConstruct struct {
	name   string
	rules  string
	setup  string // shell run in the namespace before the rules are loaded
	send   string // python3
	pkts   []string
	assume []string
}

var kernelConstructs = []kernelConstruct{
	{
		name: "ct zone",
		rules: `table inet z {
	chain out {
		type filter hook output priority raw; policy accept;
		udp dport 9 ct zone set 7
		udp dport 10 ct original zone set 8
		udp dport 11 ct zone set 9
	}
	chain late {
		type filter hook output priority filter; policy accept;
		udp dport 11 ct zone set 10
	}
	chain in {
		type filter hook input priority filter; policy accept;
		meta l4proto != udp accept
		ct zone 7 counter
		ct original zone 7 counter
		ct reply zone 7 counter
		ct zone 8 counter
		ct original zone 8 counter
		ct reply zone 8 counter
		ct reply zone 0 counter
		ct zone 9 counter
		ct zone 10 counter
		ct zone 0 counter
	}
}
`,
		send: udpSend(9, 10, 11, 12),
		pkts: udpPkts(9, 10, 11, 12),
	},
	{
		// A connection's SYN and its first ACK (the client then resets it).
		name: "tcp options",
		rules: `table inet o {
	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		meta l4proto != tcp accept
		tcp flags rst accept
		tcp option maxseg exists counter
		tcp option maxseg size 65495 counter
		tcp option maxseg size 1460 counter
		tcp option sack-perm exists counter
		tcp option sack-perm missing counter
		tcp option timestamp exists counter
		tcp option window exists counter
		tcp option window count 10 counter
		tcp option mptcp exists counter
		tcp option md5sig missing counter
		tcp option nop exists counter
		tcp option timestamp length 10 counter
		tcp option sack0 exists counter
	}
}
`,
		send: `import socket, struct
l = socket.socket()
l.bind(("127.0.0.2", 8))
l.listen()
c = socket.socket()
c.bind(("127.0.0.1", 40000))
c.connect(("127.0.0.2", 8))
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
c.close()
`,
		pkts: []string{"tcp 127.0.0.1:40000 -> 127.0.0.2:8", "tcp 127.0.0.1:40000 -> 127.0.0.2:8 ct established"},
	},
}

// udpSend is a python script sending an empty datagram from 127.0.0.1:40000 to each
// port of 127.0.0.2; udpPkts are the same datagrams as packets.
func udpSend(ports ...int) string {
	s := "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind((\"127.0.0.1\", 40000))\n"
	for _, p := range ports {
		s += "s.sendto(b\"\", (\"127.0.0.2\", " + strconv.Itoa(p) + "))\n"
	}
	return s
}

func udpPkts(ports ...int) []string {
	var out []string
	for _, p := range ports {
		out = append(out, "udp 127.0.0.1:40000 -> 127.0.0.2:"+strconv.Itoa(p))
	}
	return out
}

// TestKernelConstructs runs every kernelConstructs case against the kernel.
func TestKernelConstructs(t *testing.T) {
	testenv.RequireRoot(t, "unshare", "nft", "ip", "python3")
	for _, kc := range kernelConstructs {
		t.Run(kc.name, func(t *testing.T) {
			dir := t.TempDir()
			rules, send := filepath.Join(dir, "rules.nft"), filepath.Join(dir, "send.py")
			if err := os.WriteFile(rules, []byte(kc.rules), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(send, []byte(kc.send), 0o644); err != nil {
				t.Fatal(err)
			}
			script := `set -e; ip link set lo up; ` + kc.setup + `
nft -f "$1"; python3 "$2"; nft list ruleset`
			out, err := exec.Command("unshare", "-n", "sh", "-c", script, "sh", rules, send).CombinedOutput()
			if err != nil {
				t.Fatalf("kernel run: %v\n%s", err, out)
			}
			prog, err := CompileTextOptions(kc.rules, CompileOptions{Forks: true})
			if err != nil {
				t.Fatal(err)
			}
			compareCounts(t, kernelCounts(t, string(out)), simCountsAssuming(t, prog, kc.pkts, kc.assume), kc.rules, string(out))
		})
	}
}

// simCountsAssuming is simCounts on the branch of each trace that assumes every one
// of assume.
func simCountsAssuming(t *testing.T, prog *Program, pkts []string, assume []string) map[string]map[int]int {
	t.Helper()
	counts := map[string]map[int]int{}
	for _, pkt := range pkts {
		tr := mustTrace(t, prog, pkt, Env{})
		var picked []*Branch
		for i := range tr.Branches {
			if assumesAll(tr.Branches[i], assume) {
				picked = append(picked, tr.Branches[i])
			}
		}
		if len(picked) != 1 {
			t.Fatalf("%s: %d branches assume %q, want 1:\n%s", pkt, len(picked), assume, tr)
		}
		for _, s := range picked[0].Steps {
			if s.Kind == StepRule && s.Matched {
				if counts[s.Chain] == nil {
					counts[s.Chain] = map[int]int{}
				}
				counts[s.Chain][s.Rule]++
			}
		}
	}
	return counts
}

// assumesAll reports whether each of want is part of one of b's assumptions.
func assumesAll(b *Branch, want []string) bool {
	got := strings.Join(b.Assumptions(), "\n")
	for _, w := range want {
		if !strings.Contains(got, w) {
			return false
		}
	}
	return true
}
