package sim

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testenv"
)

// kernelMatchRules are counted matches on the header and meta fields the simulator
// derives from a packet. Rules 0 and 1 let everything but the packets sent to
// 127.0.0.2 and the ICMPv6 echo requests through uncounted (replies, resets).
const kernelMatchRules = `table inet t {
	chain input {
		type filter hook input priority 0; policy accept;
		meta nfproto ipv4 ip daddr != 127.0.0.2 accept
		meta nfproto ipv6 icmpv6 type != { echo-request, nd-router-advert, nd-neighbor-solicit } accept
		icmp type echo-request counter
		icmp type echo-reply counter
		icmp code net-unreachable counter
		icmp type timestamp-request counter
		icmpv6 type echo-request counter
		icmpv6 type { nd-router-advert, nd-neighbor-solicit } counter
		tcp flags syn / fin,syn,rst,ack counter
		tcp flags & (fin | syn | rst | ack) == ack counter
		tcp flags syn counter
		tcp flags ! fin,syn,rst,psh,ack,urg counter
		ip frag-off & 0x4000 != 0 counter
		ip frag-off & 0x1fff != 0 counter
		meta pkttype host counter
		meta pkttype { broadcast, multicast } counter
		meta iiftype loopback counter
		meta iiftype ether counter
		meta length 84 counter
		meta length 60 counter
		meta length 28 counter
		meta length 104 counter
		meta length 40 counter
		ip ttl 64 counter
		ip ttl < 64 counter
		ip dscp cs0 counter
		ip dscp { af41, ef } counter
		ip version 4 counter
		ip length 60 counter
		ip6 hoplimit 64 counter
		ip6 length 64 counter
		ip6 length 16 counter
		ip6 length 24 counter
		meta length 56 counter
		meta length 64 counter
		fib saddr . iif oif missing counter
		fib saddr . mark . iif oif exists counter
		meta skuid 0 counter
		meta skgid != 0 counter
	}
}
`

// kernelSend sends, from 127.0.0.1, an ICMP echo request (56 bytes of data, as ping)
// and an ICMP timestamp request to 127.0.0.2, a TCP SYN to 127.0.0.2:9 (refused), an empty UDP datagram to
// 127.0.0.2:9 and an ICMPv6 echo request, router advertisement and neighbor
// solicitation to ::1.
const kernelSend = `
import socket, struct
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    s += s >> 16
    return ~s & 0xffff
data = bytes(56)
hdr = struct.pack("!BBHHH", 8, 0, 0, 0x1234, 1)
hdr = struct.pack("!BBHHH", 8, 0, csum(hdr + data), 0x1234, 1)
socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).sendto(hdr + data, ("127.0.0.2", 0))
ts = bytes(12)
hdr = struct.pack("!BBHHH", 13, 0, 0, 0x1234, 2)
hdr = struct.pack("!BBHHH", 13, 0, csum(hdr + ts), 0x1234, 2)
socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).sendto(hdr + ts, ("127.0.0.2", 0))
t = socket.socket()
t.settimeout(1)
try:
    t.connect(("127.0.0.2", 9))
except OSError:
    pass
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"", ("127.0.0.2", 9))
s6 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s6.sendto(struct.pack("!BBHHH", 128, 0, 0, 0x1234, 1) + data, ("::1", 0))
s6.sendto(struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0), ("::1", 0))
s6.sendto(struct.pack("!BBHI", 135, 0, 0, 0) + socket.inet_pton(socket.AF_INET6, "::1"), ("::1", 0))
`

var kernelPackets = []string{
	"icmp 127.0.0.1 -> 127.0.0.2",
	"icmp 127.0.0.1 -> 127.0.0.2 type timestamp-request",
	"tcp 127.0.0.1:40000 -> 127.0.0.2:9",
	"udp 127.0.0.1:40000 -> 127.0.0.2:9",
	"icmpv6 ::1 -> ::1",
	"icmpv6 ::1 -> ::1 type nd-router-advert",
	"icmpv6 ::1 -> ::1 type nd-neighbor-solicit",
}

// TestKernelMatchesRealPackets sends real packets through kernelMatchRules in a fresh
// network namespace and compares, rule by rule, how many of them the kernel counted
// with how many the simulator's traces of the same packets match.
func TestKernelMatchesRealPackets(t *testing.T) {
	testenv.RequireRoot(t, "unshare", "nft", "ip", "python3")
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.nft")
	send := filepath.Join(dir, "send.py")
	if err := os.WriteFile(rules, []byte(kernelMatchRules), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(send, []byte(kernelSend), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("unshare", "-n", "sh", "-c",
		`ip link set lo up && nft -f "$1" && python3 "$2" && nft list chain inet t input`, "sh", rules, send).CombinedOutput()
	if err != nil {
		t.Fatalf("kernel run: %v\n%s", err, out)
	}
	sim := simCounts(t, mustCompile(t, kernelMatchRules), Env{}, kernelPackets)
	compareCounts(t, kernelCounts(t, string(out)), sim, kernelMatchRules, string(out))
}

var counterRe = regexp.MustCompile(`counter packets (\d+)`)

// kernelCounts returns the counter of each rule of each listed chain, by chain name
// and rule index (0 for a rule without a counter).
func kernelCounts(t *testing.T, listing string) map[string][]int {
	t.Helper()
	counts := map[string][]int{}
	chain := ""
	for _, line := range strings.Split(listing, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "chain "):
			chain = strings.Fields(line)[1]
			continue
		case chain == "" || line == "" || strings.HasPrefix(line, "type "):
			continue
		case line == "}":
			chain = ""
			continue
		}
		n := 0
		if m := counterRe.FindStringSubmatch(line); m != nil {
			n, _ = strconv.Atoi(m[1])
		}
		counts[chain] = append(counts[chain], n)
	}
	return counts
}

// simCounts traces each packet through prog and counts, by chain and rule index, the
// branches whose rule matched; every packet must take one branch.
func simCounts(t *testing.T, prog *Program, env Env, pkts []string) map[string]map[int]int {
	t.Helper()
	counts := map[string]map[int]int{}
	for _, pkt := range pkts {
		tr := mustTrace(t, prog, pkt, env)
		if len(tr.Branches) != 1 {
			t.Fatalf("%s forks:\n%s", pkt, tr)
		}
		for _, s := range tr.Branches[0].Steps {
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

// compareCounts reports every counted rule whose kernel count differs from the
// simulator's; rules[chain] are the rules' texts.
func compareCounts(t *testing.T, kernel map[string][]int, sim map[string]map[int]int, src, listing string) {
	t.Helper()
	texts := map[string][]string{}
	chain := ""
	for _, line := range strings.Split(src, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "chain "):
			chain = strings.Fields(line)[1]
		case strings.Contains(line, "counter"):
			texts[chain] = append(texts[chain], line)
		case line != "" && line != "}" && !strings.HasPrefix(line, "type ") && !strings.HasPrefix(line, "table "):
			texts[chain] = append(texts[chain], line)
		}
	}
	if len(kernel) == 0 {
		t.Fatalf("no chains listed:\n%s", listing)
	}
	compared := 0
	for chain, cs := range kernel {
		if len(cs) != len(texts[chain]) {
			t.Fatalf("chain %s: the kernel lists %d rules, the source has %d", chain, len(cs), len(texts[chain]))
		}
		for i, n := range cs {
			if !strings.Contains(texts[chain][i], "counter") {
				continue
			}
			compared++
			if n != sim[chain][i] {
				t.Errorf("chain %s rule %d %q: the kernel counted %d packets, the simulator matched %d", chain, i, texts[chain][i], n, sim[chain][i])
			}
		}
	}
	if compared == 0 {
		t.Fatalf("no counted rule compared:\n%s", listing)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("kernel listing:\n%s", listing)
	}
}

const kernelForwardRules = `table ip t {
	chain prerouting {
		type filter hook prerouting priority raw; policy accept;
		iifname != "v0" accept
		fib saddr . iif oif missing counter
		fib saddr . mark . iif oif exists counter
		fib daddr type local counter
		fib daddr . iif type local counter
		fib daddr . iif type unicast counter
		fib daddr oif missing counter
		fib daddr oif exists counter
		fib daddr . iif oif exists counter
		fib saddr oif exists counter
		ip ttl 64 counter
		meta iiftype ether counter
		meta pkttype host counter
		meta length 28 counter
		ip frag-off & 0x4000 != 0 counter
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname != "v0" accept
		ip ttl 63 counter
		ip ttl 64 counter
		oifname "d0" counter
		meta iiftype ether meta oiftype ether counter
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname != "v0" accept
		ip ttl 64 counter
		fib saddr . iif oif exists counter
	}
}
`

// kernelForwardSetup makes, inside the namespace it runs in, a node with v0
// (10.9.0.1/24) towards a client namespace (10.9.0.2, default route via the node) and
// d0 (10.8.0.1/24), forwarding on; loads the rules ($1) and runs the client's python
// script ($2) in the client namespace.
const kernelForwardSetup = `set -e
ip link set lo up
echo 1 > /proc/sys/net/ipv4/ip_forward
unshare -n sleep 30 &
client=$!
trap 'kill $client' EXIT
sleep 0.2
ip link add v0 type veth peer name v1
ip link set v1 netns $client
ip addr add 10.9.0.1/24 dev v0
ip link set v0 up
ip link add d0 type veth peer name d1
ip link set d1 up
ip addr add 10.8.0.1/24 dev d0
ip link set d0 up
nft -f "$1"
nsenter -t $client -n sh -c 'ip link set lo up && ip addr add 10.9.0.2/24 dev v1 && ip link set v1 up && ip route add default via 10.9.0.1 && python3 "$1"' sh "$2"
sleep 0.3
nft list ruleset
`

// kernelForwardSend sends from the client a datagram forwarded to 10.8.0.5, one to
// the node, one to the node's address on d0 (local, but not on the interface it came
// in by), and one to the node with a spoofed source (10.8.0.99, routed by d0).
const kernelForwardSend = `import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.9.0.2", 40000))
s.sendto(b"", ("10.8.0.5", 9))
s.sendto(b"", ("10.9.0.1", 9))
s.sendto(b"", ("10.8.0.1", 9))
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
udp = struct.pack("!HHHH", 40000, 9, 8, 0)
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 1, 0x4000, 64, 17, 0, socket.inet_aton("10.8.0.99"), socket.inet_aton("10.9.0.1"))
r.sendto(ip + udp, ("10.9.0.1", 0))
`

// TestKernelForwardedPackets sends packets from another namespace through a node
// (a fresh namespace with two interfaces) and compares, rule by rule, the kernel's
// counts with the simulator's matches: reverse path checks (fib saddr . iif oif),
// address types, the TTL before and after forwarding, interface types.
func TestKernelForwardedPackets(t *testing.T) {
	testenv.RequireRoot(t, "unshare", "nsenter", "nft", "ip", "python3")
	dir := t.TempDir()
	files := map[string]string{"rules.nft": kernelForwardRules, "setup.sh": kernelForwardSetup, "send.py": kernelForwardSend}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("unshare", "-n", "sh", filepath.Join(dir, "setup.sh"), filepath.Join(dir, "rules.nft"), filepath.Join(dir, "send.py")).CombinedOutput()
	if err != nil {
		t.Fatalf("kernel run: %v\n%s", err, out)
	}
	env := Env{
		LocalAddrs: []netip.Addr{netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.8.0.1")},
		Routes: []Route{
			{Prefix: netip.MustParsePrefix("10.9.0.0/24"), Dev: "v0"},
			{Prefix: netip.MustParsePrefix("10.8.0.0/24"), Dev: "d0"},
		},
	}
	sim := simCounts(t, mustCompile(t, kernelForwardRules), env, []string{
		"udp 10.9.0.2:40000 -> 10.8.0.5:9 iif v0",
		"udp 10.9.0.2:40000 -> 10.9.0.1:9 iif v0",
		"udp 10.9.0.2:40000 -> 10.8.0.1:9 iif v0",
		"udp 10.8.0.99:40000 -> 10.9.0.1:9 iif v0",
	})
	compareCounts(t, kernelCounts(t, string(out)), sim, kernelForwardRules, string(out))
}

const kernelForkRules = `table inet t {
	chain input {
		type filter hook input priority 0; policy accept;
		meta nfproto ipv4 ip daddr != 127.0.0.2 accept
		limit rate 1/minute burst 1 packets counter
		limit rate over 1/minute burst 1 packets counter
		meta random & 2147483647 < 1073741824 counter
		meta random & 2147483647 < 536870912 counter
	}
}
`

// TestKernelForksCoverRealPackets sends 400 datagrams through a limit and two
// statistic matches in a fresh namespace: the kernel's limit lets some through and
// stops others, which the simulator's two assumptions cover, and the statistic
// matches count about as often as the simulator's probabilities say.
func TestKernelForksCoverRealPackets(t *testing.T) {
	testenv.RequireRoot(t, "unshare", "nft", "ip", "python3")
	const n = 400
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.nft")
	if err := os.WriteFile(rules, []byte(kernelForkRules), 0o644); err != nil {
		t.Fatal(err)
	}
	send := `import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(` + strconv.Itoa(n) + `):
    s.sendto(b"", ("127.0.0.2", 9))
`
	out, err := exec.Command("unshare", "-n", "sh", "-c",
		`ip link set lo up && nft -f "$1" && python3 -c "$2" && nft list chain inet t input`, "sh", rules, send).CombinedOutput()
	if err != nil {
		t.Fatalf("kernel run: %v\n%s", err, out)
	}
	var counts []int
	for _, m := range counterRe.FindAllStringSubmatch(string(out), -1) {
		c, _ := strconv.Atoi(m[1])
		counts = append(counts, c)
	}
	if len(counts) != 4 {
		t.Fatalf("want 4 counters:\n%s", out)
	}
	under, over := counts[0], counts[1]
	if under < 1 || over < 1 || under+over != n {
		t.Errorf("the kernel's limit: %d under, %d over of %d; want both outcomes", under, over, n)
	}

	prog, err := CompileTextOptions(kernelForkRules, CompileOptions{Forks: true})
	if err != nil {
		t.Fatal(err)
	}
	tr := mustTrace(t, prog, "udp 127.0.0.1:40000 -> 127.0.0.2:9", Env{})
	assumed := map[string]bool{}
	// rule -> probability that it matched, over the branches that assume both limits
	// (each has its own bucket) under their rate
	p := map[int]float64{}
	const underLimit = "under limit rate 1/minute burst 1 packets"
	for _, b := range tr.Branches {
		for _, a := range b.Assumptions() {
			assumed[a] = true
		}
		if strings.Join(b.Assumptions(), "; ") != underLimit+"; "+underLimit {
			continue
		}
		for _, s := range b.Steps {
			if s.Kind == StepRule && s.Chain == "input" && s.Matched {
				p[s.Rule] += b.Probability
			}
		}
	}
	for _, a := range []string{"under limit rate 1/minute burst 1 packets", "over limit rate 1/minute burst 1 packets"} {
		if !assumed[a] {
			t.Errorf("no branch assumes %q:\n%s", a, tr)
		}
	}
	for i, rule := range []int{3, 4} {
		got := float64(counts[2+i]) / n
		if d := got - p[rule]; d > 0.12 || d < -0.12 {
			t.Errorf("rule %d: the kernel matched %.2f of the packets, the simulator gives probability %.2f", rule, got, p[rule])
		}
	}
}
