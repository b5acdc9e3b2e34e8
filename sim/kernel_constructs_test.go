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
// traces of the same packets match it. Where the construct forks, assume[i] picks,
// for pkts[i], the one branch whose assumptions contain every string of it: the
// outcome the namespace's setup makes true.
type kernelConstruct struct {
	name   string
	rules  string
	setup  string // shell run in the namespace before the rules are loaded
	send   string // python3
	pkts   []string
	assume [][]string
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
	{
		// A transparent UDP socket on 127.0.0.1:8080; none on 8081.
		name: "tproxy",
		rules: `table inet p {
	chain pre {
		type filter hook prerouting priority mangle; policy accept;
		ip daddr != 127.0.0.2 accept
		meta l4proto != udp accept
		udp dport 80 tproxy ip to 127.0.0.1:8080 meta mark set 0x00000001 counter
		udp dport 81 tproxy ip to 127.0.0.1:8081 meta mark set 0x00000002 counter
		meta mark 0x00000000 counter
	}
}
`,
		send: `import socket
l = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
l.setsockopt(socket.SOL_IP, 19, 1)  # IP_TRANSPARENT
l.bind(("127.0.0.1", 8080))
` + udpSend(80, 81),
		pkts:   udpPkts(80, 81),
		assume: [][]string{{"a transparent socket listens on 127.0.0.1:8080"}, {"no socket listens on 127.0.0.1:8081"}},
	},
	{
		// A SYN sent raw: synproxy answers it, and the client's kernel resets the
		// SYN-ACK it did not ask for; osf matches nothing without a fingerprint list.
		name: "synproxy and osf",
		rules: `table ip s {
	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		tcp flags syn osf name "Linux" counter
		tcp dport 8080 counter synproxy mss 65495 wscale 7 timestamp sack-perm
		tcp dport 8080 counter
	}
}
`,
		send:   rawSYN,
		pkts:   []string{"tcp 127.0.0.1:40000 -> 127.0.0.2:8080", "tcp 127.0.0.1:40000 -> 127.0.0.2:8080 flags rst"},
		assume: [][]string{{`osf name "Linux" does not hold`}},
	},
	{
		// The copy is for 10.7.0.2 by d0, a veth whose peer never answers ARP; the
		// datagram itself goes on.
		name:  "dup",
		setup: "ip link add d0 type veth peer name d1; ip addr add 10.7.0.1/24 dev d0; ip link set d0 up",
		rules: `table ip d {
	chain pre {
		type filter hook prerouting priority filter; policy accept;
		iifname != "lo" accept
		ip daddr != 127.0.0.2 accept
		udp dport 9 dup to 10.7.0.2 device "d0" counter
		udp dport 9 counter
	}
}
`,
		send: udpSend(9),
		pkts: udpPkts(9),
	},
	{
		// Two datagrams of one source through a per-source limit of one packet
		// a minute: the first is under it, the second over.
		name: "meter",
		rules: `table inet m {
	set per_src {
		type ipv4_addr
		size 65535
		flags dynamic
	}

	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		meta l4proto != udp accept
		update @per_src { ip saddr limit rate over 1/minute burst 1 packets } counter
		meter flood size 128 { ip saddr limit rate 1/minute burst 1 packets } counter
	}
}
`,
		send: udpSend(9, 9),
		pkts: udpPkts(9, 9),
		assume: [][]string{
			{"under limit rate 1/minute burst 1 packets for its element of @per_src", "under limit rate 1/minute burst 1 packets for its element of flood"},
			{"over limit rate 1/minute burst 1 packets for its element of @per_src", "over limit rate 1/minute burst 1 packets for its element of flood"},
		},
	},
}

// rawSYN sends a TCP SYN from 127.0.0.1:40000 to 127.0.0.2:8080 through a raw
// socket, so that no socket of the sender expects the answer.
const rawSYN = `import socket, struct
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    s += s >> 16
    return ~s & 0xffff
src, dst = socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.2")
tcp = struct.pack("!HHIIBBHHH", 40000, 8080, 1, 0, 5 << 4, 0x02, 65535, 0, 0)
tcp = tcp[:16] + struct.pack("!H", csum(src + dst + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
r.sendto(tcp, ("127.0.0.2", 0))
`

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

// simCountsAssuming is simCounts on the branch of each trace (of pkts[i]) that
// assumes every one of assumes[i].
func simCountsAssuming(t *testing.T, prog *Program, pkts []string, assumes [][]string) map[string]map[int]int {
	t.Helper()
	counts := map[string]map[int]int{}
	for pi, pkt := range pkts {
		tr := mustTrace(t, prog, pkt, Env{})
		var assume []string
		if pi < len(assumes) {
			assume = assumes[pi]
		}
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
