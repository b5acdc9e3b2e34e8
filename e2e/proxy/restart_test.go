package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// lineServer serves long-lived TCP connections in a pod: it answers each line a client
// sends with "<pod> <line>", until the client closes. (The lab's echo servers answer one
// line and close.)
type lineServer struct {
	pod string
	ln  net.Listener
	wg  sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

// startLineServer listens on the pod's IPv4 address at port, inside the pod's namespace.
func startLineServer(pod *lab.Pod, port uint16) *lineServer {
	GinkgoHelper()
	s := &lineServer{pod: pod.Name}
	Expect(pod.Do(func() (err error) {
		s.ln, err = net.Listen("tcp", netip.AddrPortFrom(pod.IPv4(), port).String())
		return err
	})).To(Succeed())
	s.wg.Go(func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Go(func() {
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", s.pod, sc.Text()); err != nil {
						return
					}
				}
			})
		}
	})
	return s
}

// Close stops the server and closes its connections.
func (s *lineServer) Close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// longConn is a client's long-lived connection to a lineServer.
type longConn struct {
	name string
	c    net.Conn
	r    *bufio.Reader
	n    int
}

// dialLong connects from ns to dst; the socket stays in ns.
func dialLong(name string, ns *lab.NS, dst netip.AddrPort) *longConn {
	GinkgoHelper()
	var c net.Conn
	Expect(ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", dst.String(), time.Second)
		return err
	})).To(Succeed(), "%s: connect to %s", name, dst)
	DeferCleanup(c.Close)
	countConnections(1)
	return &longConn{name: name, c: c, r: bufio.NewReader(c)}
}

// roundTrip sends one line and checks the answer of pod.
func (l *longConn) roundTrip(pod string) error {
	l.n++
	msg := fmt.Sprintf("message %d", l.n)
	if err := l.c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(l.c, msg); err != nil {
		return fmt.Errorf("%s: send %q: %w", l.name, msg, err)
	}
	line, err := l.r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("%s: answer to %q: %w", l.name, msg, err)
	}
	if want := pod + " " + msg + "\n"; line != want {
		return fmt.Errorf("%s: answer %q, want %q", l.name, line, want)
	}
	return nil
}

// tableHandle returns the kernel's handle of the proxier's table of family, which changes
// when the table is deleted and created anew.
func tableHandle(ctx context.Context, l *lab.Lab, family, table string) string {
	GinkgoHelper()
	out, err := l.Node.Exec(ctx, "", "nft", "-a", "list", "table", family, table)
	Expect(err).NotTo(HaveOccurred())
	m := regexp.MustCompile(`table \S+ \S+ \{ # handle (\d+)`).FindStringSubmatch(out)
	Expect(m).NotTo(BeNil(), "no table handle in:\n%s", out)
	return m[1]
}

// The long-lived Service of the restart suite: pod-a's line server.
var (
	cipPersist      = ap("172.30.0.30", 80)
	nodePortPersist = uint16(30086)
	persistPort     = uint16(9000)
	cipLate         = ap("172.30.0.31", 80) // created while the proxier is down
)

var _ = Describe("Restart", Label("kernel"), func() {
	It("keeps established connections when a new proxier adopts the table with a full sync", func(ctx SpecContext) {
		l := newLab(topology())
		srv := startLineServer(l.Pod(podA), persistPort)
		DeferCleanup(srv.Close)

		svcs, sls := fixtureObjects()
		svcs = append(svcs, service("persist", cipPersist).nodePort(nodePortPersist).obj())
		sls = append(sls, endpointSlice("persist", "persist-v4", false,
			[]discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(persistPort))}},
			endpoint{addr: l.Pod(podA).IPv4(), node: localNode}))
		first := newNodeProxy(l, svcs, sls, withoutMirror())
		res, err := first.Sync(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Full).To(BeTrue())
		handles := map[string]string{}
		for _, fam := range []string{"ip", "ip6"} {
			handles[fam] = tableHandle(ctx, l, fam, first.cfg.Table)
		}

		conns := []*longConn{
			dialLong("external -> NodePort", l.Client, nodePortOf(false, nodePortPersist)),
			dialLong("pod -> ClusterIP", l.Pod(podC).NS, cipPersist),
		}
		for _, c := range conns {
			for range 5 {
				Expect(c.roundTrip(podA)).To(Succeed())
			}
		}

		// Data keeps flowing on both connections, every 10 ms, across the restart.
		var (
			mu       sync.Mutex
			trips    int
			failures []error
		)
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				for _, c := range conns {
					err := c.roundTrip(podA)
					mu.Lock()
					trips++
					if err != nil {
						failures = append(failures, err)
					}
					mu.Unlock()
				}
			}
		}()
		stopTrips := sync.OnceFunc(func() { close(stop); <-done })
		DeferCleanup(stopTrips)
		time.Sleep(200 * time.Millisecond)

		// The proxier restarts, knowing nothing. Meanwhile one Service went away and
		// another came; the new proxier's informers list the cluster as it is now.
		svcs = slices.DeleteFunc(svcs, func(s *v1.Service) bool { return s.Name == "web-eip" })
		svcs = append(svcs, service("late", cipLate).obj())
		sls = append(sls, podSlices(svcs[len(svcs)-1], podB)...)
		second := newNodeProxy(l, svcs, sls, withoutMirror())
		start := time.Now()
		res, err = second.Sync(ctx)
		took := time.Since(start)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Full).To(BeTrue(), "a new proxier's first sync is full")
		time.Sleep(200 * time.Millisecond)
		stopTrips()

		mu.Lock()
		Expect(failures).To(BeEmpty(), "round trips failed across the restart")
		Expect(trips).To(BeNumerically(">=", 10))
		n := trips
		mu.Unlock()
		for _, c := range conns {
			for range 5 {
				Expect(c.roundTrip(podA)).To(Succeed(), "after the restart")
			}
		}
		// The table was adopted, not deleted and created anew, and holds exactly what the
		// new proxier wants: nothing of the Service deleted while it was down.
		for _, fam := range []string{"ip", "ip6"} {
			Expect(tableHandle(ctx, l, fam, second.cfg.Table)).To(Equal(handles[fam]), "table %s %s was recreated", fam, second.cfg.Table)
		}
		expectKernelMatchesApplied(ctx, second, knftables.IPv4Family)
		expectKernelMatchesApplied(ctx, second, knftables.IPv6Family)

		// New connections work, to the new Service too; the deleted one is gone.
		answered("new connection: external -> NodePort", exchanges(l.Client, tcp(nodePortOf(false, nodePortWeb)), 10, 1))
		fresh := dialLong("new long connection: external -> NodePort", l.Client, nodePortOf(false, nodePortPersist))
		Expect(fresh.roundTrip(podA)).To(Succeed())
		Expect(answered("new Service", exchanges(l.Pod(podC).NS, tcp(cipLate), 10, 1))).To(Equal(map[string]int{podB: 10}))
		expectDropped(l, l.Pod(podC).NS, tcp(cipExternal)) // now an unallocated service address
		_, err = l.Client.Echo(lab.Request{Proto: lab.TCP, Dst: externalWeb, Timeout: dropTimeout})
		Expect(errors.Is(err, lab.ErrTimeout)).To(BeTrue(), "the deleted Service's ExternalIP must not be served: %v", err)
		countConnections(2)

		report("restart: 2 established connections (external -> NodePort, pod -> ClusterIP) kept exchanging data across the new proxier's full sync (%v, %d operations, table adopted): %d round trips during the restart, 0 failed; new connections work",
			took.Round(time.Millisecond), res.Operations, n)
	})
})
