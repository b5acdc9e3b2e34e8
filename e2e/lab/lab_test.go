package lab_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

var _ = Describe("Lab topology", Label("kernel"), func() {
	var l *lab.Lab
	BeforeEach(func() {
		l = newLab(dualStack())
	})

	// echo asserts that from reaches pod at dst and that the pod saw the source wantSrc
	// (the client's own address when wantSrc is invalid).
	echo := func(from *lab.NS, proto lab.Proto, dst netip.AddrPort, pod string, wantSrc netip.Addr) lab.Reply {
		GinkgoHelper()
		r, err := from.Echo(lab.Request{Proto: proto, Dst: dst})
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Pod).To(Equal(pod))
		if wantSrc.IsValid() {
			Expect(r.Source.Addr()).To(Equal(wantSrc))
		} else {
			Expect(r.Source).To(Equal(r.Local), "source preserved")
		}
		return r
	}

	for _, v6 := range []bool{false, true} {
		family := map[bool]string{false: "IPv4", true: "IPv6"}[v6]
		addrOf := func(p *lab.Pod) netip.Addr {
			if v6 {
				return p.IPv6()
			}
			return p.IPv4()
		}
		client := map[bool]netip.Prefix{false: clientV4, true: clientV6}[v6].Addr()

		It("carries pod to pod traffic on the node over "+family, func() {
			a, b := l.Pod("pod-a"), l.Pod("pod-b")
			for _, proto := range []lab.Proto{lab.TCP, lab.UDP} {
				r := echo(a.NS, proto, ap(addrOf(b), 8080), "pod-b", netip.Addr{})
				Expect(r.Source.Addr()).To(Equal(addrOf(a)))
			}
		})

		It("carries pod to remote pod traffic over "+family, func() {
			a, r := l.Pod("pod-a"), l.Pod("pod-r")
			Expect(r.Remote).To(BeTrue())
			for _, proto := range []lab.Proto{lab.TCP, lab.UDP} {
				echo(a.NS, proto, ap(addrOf(r), 8080), "pod-r", addrOf(a))
				echo(r.NS, proto, ap(addrOf(a), 8080), "pod-a", addrOf(r))
			}
		})

		It("carries external client to pod traffic over "+family, func() {
			for _, proto := range []lab.Proto{lab.TCP, lab.UDP} {
				echo(l.Client, proto, ap(addrOf(l.Pod("pod-b")), 8080), "pod-b", client)
				echo(l.Client, proto, ap(addrOf(l.Pod("pod-r")), 8080), "pod-r", client)
			}
		})

		It("carries node to pod traffic from the node's eth0 address over "+family, func() {
			node := map[bool]netip.Prefix{false: nodeV4, true: nodeV6}[v6].Addr()
			echo(l.Node, lab.TCP, ap(addrOf(l.Pod("pod-a")), 8080), "pod-a", node)
		})

		It("classifies a closed port as refused and an unrouted address as a timeout over "+family, func() {
			for _, proto := range []lab.Proto{lab.TCP, lab.UDP} {
				start := time.Now()
				_, err := l.Client.Echo(lab.Request{Proto: proto, Dst: ap(addrOf(l.Pod("pod-a")), 9999), Timeout: 2 * time.Second})
				Expect(err).To(MatchError(lab.ErrRefused))
				Expect(lab.Classify(err)).To(Equal(lab.Refused))
				Expect(time.Since(start)).To(BeNumerically("<", 500*time.Millisecond), "fast, not a timeout")
			}

			nowhere := netip.MustParseAddr("172.30.0.99")
			if v6 {
				nowhere = netip.MustParseAddr("fd00:30::99")
			}
			start := time.Now()
			_, err := l.Client.Echo(lab.Request{Proto: lab.TCP, Dst: ap(nowhere, 80), Timeout: 200 * time.Millisecond})
			Expect(err).To(MatchError(lab.ErrTimeout))
			Expect(lab.Classify(err)).To(Equal(lab.TimedOut))
			Expect(time.Since(start)).To(BeNumerically(">=", 200*time.Millisecond))
		})
	}

	It("binds a requested source address and port", func() {
		src := netip.AddrPortFrom(clientV4.Addr(), 40000)
		for _, proto := range []lab.Proto{lab.TCP, lab.UDP, lab.TCP} { // TCP twice: the port is reusable
			r, err := l.Client.Echo(lab.Request{Proto: proto, Dst: ap(l.Pod("pod-a").IPv4(), 8080), Src: src})
			Expect(err).NotTo(HaveOccurred())
			Expect(r.Source).To(Equal(src))
		}
	})

	It("names the node-side veths with the prefix and routes pods through them", func() {
		Expect(l.Pod("pod-a").HostVeth).To(Equal("veth0"))
		Expect(l.Pod("pod-b").HostVeth).To(Equal("veth1"))
		Expect(l.Pod("pod-r").HostVeth).To(Equal("veth0")) // on the remote node
		Expect(l.Node.Do(func() error {
			link, err := netlink.LinkByName("veth1")
			if err != nil {
				return err
			}
			routes, err := netlink.RouteList(link, netlink.FAMILY_ALL)
			if err != nil {
				return err
			}
			var dsts []string
			for _, r := range routes {
				if r.Dst != nil {
					dsts = append(dsts, r.Dst.String())
				}
			}
			Expect(dsts).To(ContainElements("10.0.1.6/32", "fd00:1::6/128"))
			return nil
		})).To(Succeed())
	})

	It("sets sysctls inside the lab namespaces only", func() {
		root, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward") // read only
		Expect(err).NotTo(HaveOccurred())
		for _, ns := range []*lab.NS{l.Node, l.Remote} {
			Expect(ns.Sysctl("net.ipv4.ip_forward")).To(Equal("1"))
			Expect(ns.Sysctl("net.ipv6.conf.all.forwarding")).To(Equal("1"))
		}
		Expect(l.Client.Sysctl("net.ipv4.ip_forward")).To(Equal("0"))
		Expect(l.Node.SetSysctl("net.ipv4.conf.all.route_localnet", "1")).To(Succeed())
		Expect(l.Node.Sysctl("net.ipv4.conf.all.route_localnet")).To(Equal("1"))
		Expect(os.ReadFile("/proc/sys/net/ipv4/ip_forward")).To(Equal(root))
	})

	It("runs programs inside the namespace and restores the thread, also after a panic", func() {
		for _, ns := range l.Namespaces() {
			out, err := ns.Exec(context.Background(), "", "readlink", "/proc/thread-self/ns/net")
			Expect(err).NotTo(HaveOccurred())
			var inside string
			Expect(ns.Do(func() (err error) {
				inside, err = os.Readlink("/proc/thread-self/ns/net")
				return err
			})).To(Succeed())
			Expect(strings.TrimSpace(out)).To(Equal(inside), ns.Name())
		}
		outside, err := os.Readlink("/proc/self/ns/net")
		Expect(err).NotTo(HaveOccurred())
		Expect(func() {
			_ = l.Node.Do(func() error { panic("boom") })
		}).To(PanicWith("boom"))
		Expect(l.Node.Do(func() error { return errors.New("failed") })).To(MatchError("failed"))
		Expect(os.Readlink("/proc/self/ns/net")).To(Equal(outside))
		// The lab's leak check, run after each spec, also fails on a thread left inside.
	})

	It("refuses to work in a namespace after Close", func() {
		ns := l.Pod("pod-b").NS
		Expect(l.Close()).To(Succeed())
		ran := false
		Expect(ns.Do(func() error { ran = true; return nil })).To(MatchError(lab.ErrClosed))
		Expect(ran).To(BeFalse())
		_, err := ns.Echo(lab.Request{Proto: lab.TCP, Dst: ap(netip.MustParseAddr("10.0.1.5"), 8080)})
		Expect(err).To(MatchError(lab.ErrClosed))
	})

	It("reports SCTP support and serves or refuses SCTP accordingly", func() {
		_, err := l.Client.Echo(lab.Request{Proto: lab.SCTP, Dst: ap(l.Pod("pod-a").IPv4(), 8080)})
		if !lab.SCTPSupported() {
			Expect(err).To(MatchError(errors.ErrUnsupported))
			Skip("kernel has no SCTP sockets (CONFIG_IP_SCTP): SCTP echo is unavailable")
		}
		Expect(err).NotTo(HaveOccurred())
	})
})

var _ = Describe("Lab lifecycle", Label("kernel"), func() {
	It("removes every namespace when setup fails half-way", func() {
		spec := dualStack()
		spec.Pods[1].Addrs = spec.Pods[0].Addrs // the second host route collides
		l, err := lab.New(spec)
		Expect(err).To(MatchError(ContainSubstring("route 10.0.1.5/32")))
		Expect(l).To(BeNil())
		id := regexp.MustCompile(`^lab ([0-9a-f]+):`).FindStringSubmatch(err.Error())
		Expect(id).To(HaveLen(2), "the error names the lab: %v", err)
		recordLab(id[1])
		Expect(lab.Leaks()).NotTo(ContainElement(HavePrefix(lab.NamePrefix + id[1] + "-")))
	})

	It("reports a namespace still referred to after Close", func() {
		l, err := lab.New(lab.Spec{NodeAddrs: []netip.Prefix{nodeV4}})
		Expect(err).NotTo(HaveOccurred())
		recordLab(l.ID)
		DeferCleanup(l.Close)
		held, err := netns.GetFromPath("/run/netns/" + l.Node.Name())
		Expect(err).NotTo(HaveOccurred())
		Expect(l.Close()).To(Succeed())
		Expect(l.Leaks()).To(ConsistOf(HaveSuffix("refers to netns " + l.Node.Name())))
		Expect(held.Close()).To(Succeed())
		Expect(l.Leaks()).To(BeEmpty())
	})

	It("reports a socket left open in a lab namespace", func() {
		l, err := lab.New(lab.Spec{NodeAddrs: []netip.Prefix{nodeV4}})
		Expect(err).NotTo(HaveOccurred())
		recordLab(l.ID)
		DeferCleanup(l.Close)
		var sock net.PacketConn
		Expect(l.Node.Do(func() (err error) {
			sock, err = net.ListenPacket("udp", "127.0.0.1:0")
			return err
		})).To(Succeed())
		Expect(l.Close()).To(Succeed())
		Expect(l.Leaks()).To(ConsistOf(ContainSubstring("(socket:[")))
		Expect(sock.Close()).To(Succeed())
		Expect(l.Leaks()).To(BeEmpty())
	})

	It("rejects an inconsistent spec before creating anything", func() {
		spec := dualStack()
		spec.Client.Addrs = []netip.Prefix{netip.MustParsePrefix("192.168.99.2/24")}
		_, err := lab.New(spec)
		Expect(err).To(MatchError(ContainSubstring("not in a subnet of the node's eth0")))
		spec = dualStack()
		spec.Remote.Pods[0].Addrs = addrs("10.0.9.9")
		_, err = lab.New(spec)
		Expect(err).To(MatchError(ContainSubstring("outside the pod CIDRs")))
	})

	It("builds a node without client or remote node", func() {
		l := newLab(lab.Spec{
			NodeAddrs:  []netip.Prefix{nodeV4},
			VethPrefix: "cali",
			Pods:       []lab.PodSpec{{Name: "solo", Addrs: addrs("10.0.1.5"), Ports: []uint16{80, 443}}},
		})
		Expect(l.Client).To(BeNil())
		Expect(l.Remote).To(BeNil())
		p := l.Pod("solo")
		Expect(p.HostVeth).To(Equal("cali0"))
		for _, port := range []uint16{80, 443} {
			r, err := l.Node.Echo(lab.Request{Proto: lab.TCP, Dst: ap(p.IPv4(), port)})
			Expect(err).NotTo(HaveOccurred())
			Expect(r.Source.Addr()).To(Equal(nodeV4.Addr()))
		}
	})

	It("serves ~300 connections in a few seconds", func() {
		l := newLab(dualStack())
		start := time.Now()
		dst := ap(l.Pod("pod-r").IPv4(), 8080)
		for i := range 300 {
			_, err := l.Client.Echo(lab.Request{Proto: lab.TCP, Dst: dst})
			Expect(err).NotTo(HaveOccurred(), fmt.Sprint("connection ", i))
		}
		elapsed := time.Since(start)
		GinkgoWriter.Printf("300 TCP echoes client -> remote pod in %v\n", elapsed)
		Expect(elapsed).To(BeNumerically("<", 3*time.Second))

		// The same from 6 goroutines at once, over both protocols and families.
		var wg sync.WaitGroup
		errs := make(chan error, 300)
		for g := range 6 {
			wg.Go(func() {
				defer GinkgoRecover()
				proto := []lab.Proto{lab.TCP, lab.UDP}[g%2]
				dst := ap(l.Pod("pod-a").IPv4(), 8080)
				if g >= 3 {
					dst = ap(l.Pod("pod-a").IPv6(), 8080)
				}
				for range 50 {
					r, err := l.Pod("pod-b").Echo(lab.Request{Proto: proto, Dst: dst})
					if err == nil && r.Pod != "pod-a" {
						err = fmt.Errorf("answered by %s", r.Pod)
					}
					if err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		Expect(errs).To(BeEmpty())
	})
})
