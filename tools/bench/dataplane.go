package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// The data-plane topology: the node, the target Service's backend pods and a client
// pod, all on the node (client pod -> node -> backend pod, forwarded and DNATed).
var (
	targetVIP = netip.MustParseAddr("172.31.255.1")
	backends  = []netip.Addr{
		netip.MustParseAddr("10.200.0.10"), netip.MustParseAddr("10.200.0.11"),
		netip.MustParseAddr("10.200.0.12"), netip.MustParseAddr("10.200.0.13"),
		netip.MustParseAddr("10.200.0.14"),
	}
	clientAddr = netip.MustParseAddr("10.200.1.2")
)

// newBenchLab builds the data-plane topology in fresh namespaces.
func newBenchLab() (*lab.Lab, error) {
	spec := lab.Spec{NodeAddrs: []netip.Prefix{nodeAddr}}
	for i, b := range backends {
		spec.Pods = append(spec.Pods, lab.PodSpec{Name: fmt.Sprintf("backend-%d", i), Addrs: []netip.Addr{b}, Ports: []uint16{targetPort}})
	}
	spec.Pods = append(spec.Pods, lab.PodSpec{Name: "client", Addrs: []netip.Addr{clientAddr}, Ports: []uint16{9}})
	return lab.New(spec)
}

// withTarget adds the data-plane target to a generated cluster.
func withTarget(c *cluster) { c.addTarget(targetVIP, backends) }

// DataPlaneResult is the new-connection latency through one ruleset at one N.
type DataPlaneResult struct {
	N        int     `json:"n"`
	Ruleset  string  `json:"ruleset"`
	Connects int     `json:"connects"`
	Failures int     `json:"failures"`
	Micros   Summary `json:"connect_us"`
}

// dataPlaneLab is a lab loaded with one ruleset, ready to be measured.
type dataPlaneLab struct {
	n       int
	ruleset string
	lab     *lab.Lab
	samples []float64
	fails   int
}

// connectBatch makes count TCP connections from the lab's client pod to the target
// VIP, each a blocking connect() (SYN out, SYN-ACK back through DNAT) timed alone and
// then reset, so that no TIME_WAIT piles up.
func (d *dataPlaneLab) connectBatch(count int) error {
	client := d.lab.Pod("client")
	sa := &unix.SockaddrInet4{Port: servicePort, Addr: targetVIP.As4()}
	return client.Do(func() error {
		for range count {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("socket: %w", err)
			}
			_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
			_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 1})
			t0 := time.Now()
			err = unix.Connect(fd, sa)
			dt := time.Since(t0)
			unix.Close(fd)
			if err != nil {
				d.fails++
				if d.fails > 50 && d.fails > len(d.samples) {
					return fmt.Errorf("connect to %s:%d from the client pod: %w (%d failures)", targetVIP, servicePort, err, d.fails)
				}
				continue
			}
			d.samples = append(d.samples, float64(dt.Nanoseconds())/1e3)
		}
		return nil
	})
}

// measureDataPlane measures every lab in turns of small batches, so that a change
// of the machine's load during the run affects all of them alike.
func measureDataPlane(ctx context.Context, p *progress, labs []*dataPlaneLab, connects, warmup int) ([]DataPlaneResult, error) {
	const batch = 50
	for _, d := range labs {
		if err := d.lab.Node.FlushConntrack(); err != nil {
			return nil, err
		}
		if err := d.connectBatch(warmup); err != nil {
			return nil, fmt.Errorf("data plane %s N=%d: warm-up: %w", d.ruleset, d.n, err)
		}
		d.samples, d.fails = nil, 0
	}
	last := time.Now()
	for round := 0; round*batch < connects; round++ {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		for i := range labs {
			d := labs[(i+round)%len(labs)]
			if err := d.connectBatch(min(batch, connects-round*batch)); err != nil {
				return nil, fmt.Errorf("data plane %s N=%d: %w", d.ruleset, d.n, err)
			}
		}
		if time.Since(last) > 5*time.Second {
			p.printf("%d of %d connections per ruleset", (round+1)*batch, connects)
			last = time.Now()
		}
	}
	var out []DataPlaneResult
	for _, d := range labs {
		if len(d.samples) == 0 {
			return nil, errors.New("data plane: no connection succeeded")
		}
		out = append(out, DataPlaneResult{N: d.n, Ruleset: d.ruleset, Connects: len(d.samples), Failures: d.fails, Micros: summarize(d.samples)})
	}
	return out, nil
}
