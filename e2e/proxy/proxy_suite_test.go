package proxy_test

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

func TestProxy(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "e2e/proxy suite")
}

// labIDs are the labs this suite built, so that the final leak check ignores namespaces of
// other processes running labs at the same time.
var (
	labIDsMu sync.Mutex
	labIDs   []string
)

func recordLab(id string) {
	labIDsMu.Lock()
	defer labIDsMu.Unlock()
	labIDs = append(labIDs, id)
}

// skipSuite skips every spec, saying why also where Ginkgo is not verbose.
func skipSuite(why string) {
	fmt.Fprintln(os.Stderr, "e2e/proxy: skipping the suite: "+why)
	Skip(why)
}

var _ = BeforeSuite(func() {
	if err := lab.Usable(); err != nil {
		skipSuite(err.Error())
	}
	removed, err := lab.RemoveStale(30 * time.Minute)
	Expect(err).NotTo(HaveOccurred())
	if len(removed) > 0 {
		GinkgoWriter.Printf("removed stale lab namespaces: %v\n", removed)
	}
})

// specConnections is the connection count when the current spec started.
var specConnections int

var _ = BeforeEach(func() {
	specConnections = connections()
})

var _ = AfterEach(func() {
	report("connections made by this spec: %d", connections()-specConnections)
})

var _ = AfterSuite(func() {
	if lab.Usable() != nil {
		return
	}
	GinkgoWriter.Printf("connections made by the suite: %d\n", connections())
	labIDsMu.Lock()
	defer labIDsMu.Unlock()
	Expect(lab.LeaksOf(labIDs)).To(BeEmpty(), "lab namespaces left behind by this suite")
})

// newLab builds spec for the current spec and removes it afterwards, also when the spec
// fails, checking that no namespace, thread or socket was left behind. On failure the
// state of every namespace is attached to the report.
func newLab(spec lab.Spec) *lab.Lab {
	GinkgoHelper()
	l, err := lab.New(spec)
	Expect(err).NotTo(HaveOccurred())
	recordLab(l.ID)
	DeferCleanup(func() {
		Expect(l.Close()).To(Succeed())
		Expect(l.Leaks()).To(BeEmpty(), "namespaces, threads or descriptors of lab %s", l.ID)
	})
	DeferCleanup(func(ctx SpecContext) { // runs first: cleanups run in reverse order
		if CurrentSpecReport().Failed() {
			AddReportEntry("lab "+l.ID, l.Dump(ctx))
		}
	})
	return l
}

// report prints a figure of the run, e.g. a connection count or a recovery time, and
// attaches it to the spec's report so that it shows in every run's output.
func report(format string, args ...any) {
	GinkgoHelper()
	AddReportEntry("figure", ReportEntryVisibilityAlways, fmt.Sprintf(format, args...))
	GinkgoWriter.Printf("FIGURE: "+format+"\n", args...)
}
