package features_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/nftproxy/nftproxy/e2e/kernel"
	"github.com/nftproxy/nftproxy/features"
)

func TestFeatures(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Features")
}

// backends are the places every scenario runs. The kernel backend joins them when
// it is available (root, nft installed); otherwise the suite says why it runs the
// simulator only.
var backends = func() []func() features.Backend {
	bs := []func() features.Backend{
		func() features.Backend { return features.NewSimBackend() },
	}
	if err := kernel.Available(); err != nil {
		fmt.Fprintf(os.Stderr, "features: running the simulator backend only: %v\n", err)
		return bs
	}
	return append(bs, func() features.Backend { return kernel.New() })
}()

var scenarios = func() []*features.Scenario {
	scs, err := features.LoadDir(".")
	if err != nil {
		panic(fmt.Sprintf("loading scenarios: %v", err))
	}
	for _, sc := range scs {
		for _, w := range sc.Warnings {
			fmt.Fprintf(os.Stderr, "features: %s: config: %s\n", sc.File, w)
		}
	}
	return scs
}()

var _ = Describe("feature scenarios", func() {
	It("are there", func() {
		Expect(len(scenarios)).To(BeNumerically(">", 0), "no scenario files found under features/")
	})
	for _, newBackend := range backends {
		for _, sc := range scenarios {
			describeScenario(sc, newBackend)
		}
	}
})

func describeScenario(sc *features.Scenario, newBackend func() features.Backend) {
	name := newBackend().Name()
	labels := Label(append([]string{sc.Feature, name}, sc.Labels...)...)
	Describe(fmt.Sprintf("%s [%s] %s", filepath.ToSlash(sc.File), name, sc.Pins), labels, Ordered, ContinueOnFailure, func() {
		var (
			run *features.Run
			// chosen remembers the endpoint each client's last connection went to.
			chosen map[netip.Addr]netip.AddrPort
		)
		BeforeAll(func() {
			b := newBackend()
			DeferCleanup(b.Close)
			var err error
			run, err = features.Start(sc, b)
			Expect(err).NotTo(HaveOccurred())
			chosen = map[netip.Addr]netip.AddrPort{}
		})
		for _, step := range sc.Steps {
			title := fmt.Sprintf("line %d: %s", step.Line, step.Name)
			switch {
			case step.Packet != nil:
				It(title, func() {
					obs, err := run.Send(*step.Packet, step.From, step.Expect)
					if errors.Is(err, features.ErrUnsupported) {
						Skip(err.Error())
					}
					Expect(err).NotTo(HaveOccurred(), "%s:%d: sending %s", sc.File, step.Line, step.Packet)
					client := step.Packet.Src.Addr()
					if err := features.Check(step.Expect, obs, chosen[client]); err != nil {
						Fail(fmt.Sprintf("%s:%d [%s]: packet %s from %s: %v\n\ntrace:\n%s",
							sc.File, step.Line, name, step.Packet, step.From, err, obs.Trace))
					}
					if obs.Chosen.IsValid() {
						chosen[client] = obs.Chosen
					}
				})
			case step.Update != nil:
				It(title, func() {
					Expect(run.Update(*step.Update)).To(Succeed())
					expectIncremental(run)
				})
			case step.Delete != nil:
				It(title, func() {
					Expect(run.Delete(step.Delete)).To(Succeed())
					expectIncremental(run)
				})
			case step.Resync:
				It(title, func() {
					Expect(run.Resync()).To(Succeed())
					// The simulator's tables are rewritten; the kernel's, which nothing
					// else writes, are verified untouched by the nf_tables generation.
					for _, s := range run.Syncs() {
						Expect(s.Result.Full || s.Result.Verified).To(BeTrue(), "the %s sync of a resync step: %+v", s.Family, s.Result)
					}
				})
			case step.Advance > 0:
				It(title, func() {
					err := run.Advance(step.Advance)
					if errors.Is(err, features.ErrUnsupported) {
						Skip(err.Error())
					}
					Expect(err).To(Succeed())
				})
			}
		}
	})
}

// expectIncremental asserts that the last sync of every family that wrote anything
// was incremental, as a change after the first sync is in production.
func expectIncremental(run *features.Run) {
	GinkgoHelper()
	for _, s := range run.Syncs() {
		if s.Result.Operations > 0 {
			Expect(s.Result.Full).To(BeFalse(), "the %s sync of a change step", s.Family)
		}
	}
}
