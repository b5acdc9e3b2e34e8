package sim

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testenv"
	"github.com/nftproxy/nftproxy/packet"
)

// kernelConstruct is one construct checked against the kernel: its rules loaded in a
// fresh network namespace (lo up), real packets sent on lo by a python script, and
// every counted rule's kernel counter compared with how many of the simulator's
// traces of the same packets match it, on the rules as written and on the kernel's
// JSON listing of them (nft -j list ruleset). Where the construct forks, assume[i] picks,
// for pkts[i], the one branch whose assumptions contain every string of it: the
// outcome the namespace's setup makes true.
type kernelConstruct struct {
	name string
	// rules are loaded with nft -f; when empty, setup makes them (iptables-nft) and
	// the simulator compiles the kernel's listing.
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
		assume: [][]string{{"does not hold"}}, // osf
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
	{
		// Six datagrams to ports 20-25: notrack, mark and ct mark set through
		// bitwise operations, nftrace, dscp and ttl set, a verdict map on a
		// concatenation, numgen inc round robin, and the link layer (which the
		// packet cannot show: a fork; looped back packets have no MAC header).
		name: "statements",
		rules: `table ip st {
	chain out {
		type filter hook output priority raw; policy accept;
		ip daddr != 127.0.0.2 accept
		udp dport 20 notrack
		udp dport 21 meta mark set meta mark & 0xffff0005 | 0x00000005
		udp dport 21 meta mark set meta mark | 0x00004000
		udp dport 22 meta nftrace set 1
		udp dport 23 ip dscp set af41
		udp dport 23 ip ttl set 5
	}

	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		meta l4proto != udp accept
		ct state untracked counter
		ct mark set ct mark & 0xffff0007 | 0x00000007
		ct mark 0x00000007 counter
		meta mark 0x00004005 counter
		ip dscp af41 counter
		ip ttl 5 counter
		ether saddr 00:00:00:00:00:00 counter
		ip saddr . udp dport vmap { 127.0.0.1 . 24 : jump v24, 127.0.0.1 . 25 : jump v25 }
		numgen inc mod 2 vmap { 0 : jump n0, 1 : jump n1 }
	}

	chain v24 {
		counter
	}

	chain v25 {
		counter
	}

	chain n0 {
		counter
	}

	chain n1 {
		counter
	}
}
`,
		send:   udpSend(20, 21, 22, 23, 24, 25),
		pkts:   udpPkts(20, 21, 22, 23, 24, 25),
		assume: repeat([]string{"ether saddr 00:00:00:00:00:00 does not hold"}, 6),
	},
	{
		// Three datagrams, to a bound port (10) and two without a socket: the
		// first within the quota and the connection count, the others over.
		name: "quota, ct count, socket, meta time",
		rules: `table inet f {
	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		meta l4proto != udp accept
		quota until 40 bytes counter
		quota over 40 bytes counter
		ct count 1 counter
		ct count over 1 counter
		socket transparent 0 counter
		meta time > "2020-01-01 00:00:00" counter
		counter
	}
}
`,
		send: `import socket
l = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
l.bind(("127.0.0.2", 10))
` + udpSend(10, 9, 11),
		pkts: udpPkts(10, 9, 11),
		assume: [][]string{
			{"within quota", "not yet quota over", "at most 1 connections", "socket transparent 0 holds", "time > \"2020-01-01 00:00:00\" holds"},
			{"bytes used up", "exceeded", "more than 1 connections", "socket transparent 0 does not hold", "time > \"2020-01-01 00:00:00\" holds"},
			{"bytes used up", "exceeded", "more than 1 connections", "socket transparent 0 does not hold", "time > \"2020-01-01 00:00:00\" holds"},
		},
	},
	{
		// Datagrams to ports 9-12 looped back through lo's ingress: 10 is dropped
		// there, 12 sent out of d0 by fwd, the others reach input (dup sends a copy
		// out of d0).
		name:  "netdev ingress, fwd",
		setup: "ip link add d0 type veth peer name d1; ip link set d0 up",
		rules: `table netdev n {
	chain ing {
		type filter hook ingress device "lo" priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		udp dport 9 counter
		udp dport 10 counter drop
		udp dport 12 counter fwd to "d0"
		ip saddr 127.0.0.1 dup to "d0"
		counter
	}
}
table inet i {
	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		meta l4proto udp counter
	}
}
`,
		send: udpSend(9, 10, 11, 12),
		pkts: udpPkts(9, 10, 11, 12),
	},
	{
		// Stateless NAT in prerouting: a port, a destination and a source rewritten.
		name: "payload set",
		rules: `table ip s {
	chain pre {
		type filter hook prerouting priority filter; policy accept;
		iifname != "lo" accept
		udp dport 9 udp dport set 10
		udp dport 11 ip daddr set 127.0.0.3
		udp dport 12 ip saddr set 127.0.0.5
	}

	chain in {
		type filter hook input priority filter; policy accept;
		meta l4proto != udp accept
		ip daddr 127.0.0.3 counter
		ip saddr 127.0.0.5 counter
		ip daddr != 127.0.0.2 accept
		udp dport 9 counter
		udp dport 10 counter
	}
}
`,
		send: udpSend(9, 11, 12),
		pkts: udpPkts(9, 11, 12),
	},
	{
		// iptables extensions nft shows only by name: recent --set always matches,
		// string finds nothing in an empty datagram, u32 tests the source port.
		name: "xt matches",
		setup: `iptables-nft -A INPUT -d 127.0.0.2 -p udp -m recent --set --name seen
iptables-nft -A INPUT -d 127.0.0.2 -p udp -m string --string frob --algo bm
iptables-nft -A INPUT -d 127.0.0.2 -p udp -m u32 --u32 "0>>22&0x3C@0>>16=40000"
iptables-nft -A INPUT -d 127.0.0.2 -p udp`,
		send:   udpSend(9),
		pkts:   udpPkts(9),
		assume: [][]string{{`"recent" matches`, `"string" does not match`, `"u32" matches`}},
	},
	{
		// firewalld's ftp helper: assigned before conntrack, the SYN goes on.
		name: "ct helper",
		rules: `table inet h {
	ct helper helper-ftp-tcp {
		type "ftp" protocol tcp
		l3proto inet
	}

	chain pre {
		type filter hook prerouting priority raw + 10; policy accept;
		tcp dport 21 ct helper set "helper-ftp-tcp"
	}

	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		tcp dport 21 counter
	}
}
`,
		send: `import socket
c = socket.socket()
c.bind(("127.0.0.1", 40000))
c.settimeout(1)
try:
    c.connect(("127.0.0.2", 21))
except OSError:
    pass
`,
		pkts: []string{"tcp 127.0.0.1:40000 -> 127.0.0.2:21"},
	},
	{
		// Twelve datagrams from ports 40000-40011: jhash with a listed seed is the
		// kernel's Jenkins hash, one field or a concatenation.
		name: "jhash",
		rules: `table ip j {
	chain in {
		type filter hook input priority filter; policy accept;
		ip daddr != 127.0.0.2 accept
		meta l4proto != udp accept
		meta mark set jhash ip saddr . udp sport mod 4 seed 0xdeadbeef offset 10
		meta mark 10 counter
		meta mark 11 counter
		meta mark 12 counter
		meta mark 13 counter
		meta mark set jhash udp sport mod 3 seed 0x1
		meta mark 0 counter
		meta mark 1 counter
		meta mark 2 counter
	}
}
`,
		send: `import socket
for p in range(40000, 40012):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", p))
    s.sendto(b"", ("127.0.0.2", 9))
`,
		pkts: func() []string {
			var out []string
			for p := 40000; p < 40012; p++ {
				out = append(out, "udp 127.0.0.1:"+strconv.Itoa(p)+" -> 127.0.0.2:9")
			}
			return out
		}(),
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

// repeat is n copies of a.
func repeat(a []string, n int) [][]string {
	out := make([][]string, n)
	for i := range out {
		out[i] = a
	}
	return out
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
			if m := testenv.Missing("iptables-nft"); strings.Contains(kc.setup, "iptables-nft") && m != "" {
				t.Skipf("needs iptables-nft: %s", m)
			}
			dir := t.TempDir()
			rules, send := filepath.Join(dir, "rules.nft"), filepath.Join(dir, "send.py")
			if err := os.WriteFile(rules, []byte(kc.rules), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(send, []byte(kc.send), 0o644); err != nil {
				t.Fatal(err)
			}
			script := `set -e; ip link set lo up; ` + kc.setup + `
nft -f "$1"; python3 "$2"; nft list ruleset; echo '#json'; nft -j list ruleset`
			out, err := exec.Command("unshare", "-n", "sh", "-c", script, "sh", rules, send).CombinedOutput()
			if err != nil {
				t.Fatalf("kernel run: %v\n%s", err, out)
			}
			listing, js, _ := strings.Cut(string(out), "#json\n")
			kernel := kernelCounts(t, listing)
			written := kc.rules
			if written == "" {
				written = listing
			}
			// The rules as written, and as the kernel lists them in JSON.
			for _, src := range []string{written, js} {
				prog, err := CompileTextOptions(src, CompileOptions{Forks: true})
				if err != nil {
					t.Fatalf("%v\n%s", err, src)
				}
				compareCounts(t, kernel, simCountsAssuming(t, prog, kc.pkts, kc.assume), written, listing)
			}
		})
	}
}

// simCountsAssuming traces pkts in order through one Runtime, as the kernel saw them
// (conntrack entries, numgen inc counters and set elements carry over), committing
// for pkts[i] the one branch that assumes every one of assumes[i], and counts, by
// chain and rule index, the rules that branch matched.
func simCountsAssuming(t *testing.T, prog *Program, pkts []string, assumes [][]string) map[string]map[int]int {
	t.Helper()
	var assume []string
	var pickErr string
	rt := NewRuntime(prog, Env{Select: func(tr *Trace) int {
		picked := -1
		for i, b := range tr.Branches {
			if assumesAll(b, assume) {
				if picked >= 0 {
					pickErr = "more than one branch"
				}
				picked = i
			}
		}
		if picked < 0 {
			pickErr, picked = "no branch", 0
		}
		return picked
	}})
	counts := map[string]map[int]int{}
	for pi, pkt := range pkts {
		assume, pickErr = nil, ""
		if pi < len(assumes) {
			assume = assumes[pi]
		}
		tr, err := rt.Trace(packet.MustParse(pkt))
		if err != nil {
			t.Fatalf("Trace(%s): %v", pkt, err)
		}
		if pickErr != "" {
			t.Fatalf("%s: %s assumes %q:\n%s", pkt, pickErr, assume, tr)
		}
		for _, s := range tr.Branches[tr.Committed].Steps {
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

// assumesAll reports whether each of want is part of one of b's assumptions, and
// each of b's assumptions contains one of want.
func assumesAll(b *Branch, want []string) bool {
	got := b.Assumptions()
	contains := func(a string, subs []string) bool {
		for _, s := range subs {
			if strings.Contains(a, s) {
				return true
			}
		}
		return false
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(a string) bool { return strings.Contains(a, w) }) {
			return false
		}
	}
	for _, a := range got {
		if !contains(a, want) {
			return false
		}
	}
	return true
}
