package apiserver

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/deploy"
	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/internal/testenv"
)

const (
	nodeName  = "node-a"
	podClient = "client"
	podA      = "ep-a"
	podB      = "ep-b"
	echoPort  = 8080
)

var (
	clusterIP = netip.MustParseAddr("172.30.0.10")
	podAddrs  = map[string]netip.Addr{
		podClient: netip.MustParseAddr("10.0.1.5"),
		podA:      netip.MustParseAddr("10.0.1.6"),
		podB:      netip.MustParseAddr("10.0.1.7"),
	}
)

var _ = Describe("nftproxy against a real API server", Label("apiserver"), Ordered, func() {
	var (
		l       *lab.Lab
		cp      *ControlPlane
		client  kubernetes.Interface
		dyn     dynamic.Interface
		mapper  *restmapper.DeferredDiscoveryRESTMapper
		proxy   *Process
		workDir string
		binDir  string // where the binaries are, and the latency report goes
	)

	BeforeAll(func(ctx SpecContext) {
		if why := testenv.Missing(); why != "" {
			Skip("the apiserver suite " + why)
		}
		apiserverBin, etcdBin, err := Binaries()
		if err != nil {
			Skip("the apiserver suite needs kube-apiserver and etcd: " + err.Error())
		}
		if _, err := exec.LookPath("nft"); err != nil {
			Skip("the apiserver suite needs the nft binary (make deps)")
		}
		workDir = GinkgoT().TempDir()
		binDir = filepath.Dir(apiserverBin)

		By("building nftproxy")
		bin := filepath.Join(workDir, "nftproxy")
		out, err := exec.Command("go", "build", "-o", bin, "github.com/nftproxy/nftproxy/cmd/nftproxy").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "go build ./cmd/nftproxy:\n%s", out)

		By("building the lab: a node with a client pod and two endpoint pods")
		var pods []lab.PodSpec
		for _, name := range []string{podClient, podA, podB} {
			pods = append(pods, lab.PodSpec{Name: name, Addrs: []netip.Addr{podAddrs[name]}, Ports: []uint16{echoPort}})
		}
		l, err = lab.New(lab.Spec{NodeAddrs: []netip.Prefix{netip.MustParsePrefix("192.168.77.1/24")}, Pods: pods})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(l.Close()).To(Succeed()) })

		By("starting etcd and kube-apiserver in the node's namespace")
		start := time.Now()
		cp, err = StartControlPlane(ctx, l.Node, workDir, apiserverBin, etcdBin)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(cp.Stop)
		fmt.Fprintf(GinkgoWriter, "control plane ready in %v\n", time.Since(start).Round(time.Millisecond))

		cfg := cp.RESTConfig()
		client, err = kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		dyn, err = dynamic.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))

		DeferCleanup(func() {
			if proxy != nil {
				_ = proxy.Stop()
				// Leave no table behind, even though the namespace goes too.
				_, _ = l.Node.Exec(context.Background(), "", bin, "--cleanup", "--hostname-override="+nodeName)
			}
		})
		DeferCleanup(func() {
			if CurrentSpecReport().Failed() && proxy != nil {
				fmt.Fprintf(GinkgoWriter, "nftproxy log tail:\n%s\n", proxy.Tail(8000))
			}
		})

		By("creating the Node, and starting nftproxy in the node's namespace")
		_, err = client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		proxy, err = Start(l.Node, workDir, "nftproxy", bin,
			"--kubeconfig="+cp.Kubeconfig, "--hostname-override="+nodeName,
			"--cluster-cidr=10.0.1.0/24", "--service-cidr="+ServiceCIDR,
			"--min-sync-period=0s", "--sync-period=30s",
			"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249", "--v=2")
		Expect(err).NotTo(HaveOccurred())
	})

	// dryRun applies one manifest with a server-side dry run.
	dryRun := func(ctx context.Context, name string, data []byte) {
		GinkgoHelper()
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal(data, &obj.Object)).To(Succeed(), name)
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		Expect(err).NotTo(HaveOccurred(), "%s: %s", name, gvk)
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = "kube-system" // helm install -n kube-system
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		got, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "nftproxy-e2e", DryRun: []string{metav1.DryRunAll}})
		Expect(err).NotTo(HaveOccurred(), "server-side dry-run apply of %s (%s %s)", name, gvk.Kind, obj.GetName())
		Expect(got.GetName()).To(Equal(obj.GetName()))
		fmt.Fprintf(GinkgoWriter, "dry-run apply %s: %s %s ok\n", name, gvk.Kind, obj.GetName())
	}

	It("accepts deploy/'s manifests in a server-side dry run", func(ctx SpecContext) {
		data, err := deploy.Manifests.ReadFile("kustomization.yaml")
		Expect(err).NotTo(HaveOccurred())
		var k struct {
			Resources []string `json:"resources"`
		}
		Expect(yaml.Unmarshal(data, &k)).To(Succeed())
		Expect(k.Resources).NotTo(BeEmpty())
		for _, name := range k.Resources {
			data, err := deploy.Manifests.ReadFile(name)
			Expect(err).NotTo(HaveOccurred())
			dryRun(ctx, name, data)
		}
		// A dry run persists nothing.
		_, err = client.AppsV1().DaemonSets("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{})
		Expect(err).To(HaveOccurred())
	})

	It("accepts the Helm chart's manifests in a server-side dry run", func(ctx SpecContext) {
		out, err := deploy.RenderChart(map[string]any{
			"apiServer": "https://control-plane.example:6443",
			"image":     map[string]any{"repository": "registry.example/nftproxy", "tag": "v0.0.0"},
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(out).NotTo(BeEmpty())
		for _, name := range slices.Sorted(maps.Keys(out)) {
			for i, doc := range strings.Split(out[name], "\n---") {
				if strings.TrimSpace(doc) == "" {
					continue
				}
				dryRun(ctx, fmt.Sprintf("%s#%d", name, i), []byte(doc))
			}
		}
	})

	It("routes a ClusterIP to its endpoint, and measures network programming latency", func(ctx SpecContext) {
		By("creating Service web and its EndpointSlice (endpoint ep-a)")
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
			Spec: v1.ServiceSpec{
				ClusterIP: clusterIP.String(),
				Ports:     []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(echoPort), Protocol: v1.ProtocolTCP}},
			},
		}
		// The default ServiceCIDR is made by a controller just after start: retry.
		Eventually(func() error {
			_, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
			return err
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		esClient := client.DiscoveryV1().EndpointSlices("default")
		slice, err := esClient.Create(ctx, endpointSlice(podA), metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())

		cl := l.Pod(podClient)
		req := lab.Request{Proto: lab.TCP, Dst: netip.AddrPortFrom(clusterIP, 80), Timeout: 500 * time.Millisecond}
		By("waiting for " + req.String() + " from pod client to reach ep-a")
		start := time.Now()
		Eventually(func() (string, error) {
			if proxy.Exited() {
				StopTrying("nftproxy exited:\n" + proxy.Tail(4000)).Now()
			}
			r, err := cl.Echo(req)
			return r.Pod, err
		}).WithContext(ctx).WithTimeout(60*time.Second).WithPolling(100*time.Millisecond).Should(Equal(podA),
			func() string { return "nftproxy log:\n" + proxy.Tail(4000) })
		fmt.Fprintf(GinkgoWriter, "first traffic through the ClusterIP %v after the EndpointSlice was created (includes nftproxy start)\n", time.Since(start).Round(time.Millisecond))

		By("switching the endpoint between ep-a and ep-b and timing each switch")
		const changes = 100
		const bound = 10 * time.Second
		var lat []time.Duration
		current := podA
		deadline := time.Now().Add(4 * time.Minute)
		for i := 0; i < changes && time.Now().Before(deadline); i++ {
			next := map[string]string{podA: podB, podB: podA}[current]
			want := endpointSlice(next)
			slice.Endpoints = want.Endpoints
			t0 := time.Now()
			slice, err = esClient.Update(ctx, slice, metav1.UpdateOptions{})
			Expect(err).NotTo(HaveOccurred())
			for {
				r, err := cl.Echo(lab.Request{Proto: lab.TCP, Dst: req.Dst, Timeout: 200 * time.Millisecond})
				if err == nil && r.Pod == next {
					break
				}
				if time.Since(t0) > bound {
					Fail(fmt.Sprintf("change %d: traffic not switched to %s within %v (last %q %v)\nnftproxy log:\n%s", i, next, bound, r.Pod, err, proxy.Tail(4000)))
				}
				time.Sleep(time.Millisecond)
			}
			lat = append(lat, time.Since(t0))
			current = next
		}
		Expect(len(lat)).To(BeNumerically(">=", 10), "too few changes measured")
		report := latencyReport(lat)
		fmt.Fprint(GinkgoWriter, report)
		path := os.Getenv("NFTPROXY_LATENCY_FILE")
		if path == "" {
			path = filepath.Join(binDir, "programming-latency.txt")
		}
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			fmt.Fprintf(GinkgoWriter, "could not write %s: %v\n", path, err)
		} else {
			fmt.Fprintf(GinkgoWriter, "written to %s\n", path)
		}
	})
})

// endpointSlice returns web's EndpointSlice with pod as its only, ready, endpoint.
func endpointSlice(pod string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web-1", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "nftproxy-e2e"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{podAddrs[pod].String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(nodeName),
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(echoPort)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
}

// latencyReport formats the distribution of the programming latencies.
func latencyReport(lat []time.Duration) string {
	s := slices.Clone(lat)
	slices.Sort(s)
	q := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	var b strings.Builder
	fmt.Fprintf(&b, "network programming latency (EndpointSlice update sent -> new TCP connections to the ClusterIP reach the new endpoint),\n")
	fmt.Fprintf(&b, "real kube-apiserver + etcd, nftproxy --min-sync-period=0s, %s:\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "  changes %d  min %v  p50 %v  p90 %v  p99 %v  max %v  mean %v\n", len(s),
		s[0].Round(time.Microsecond), q(0.5).Round(time.Microsecond), q(0.9).Round(time.Microsecond),
		q(0.99).Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond), (sum / time.Duration(len(s))).Round(time.Microsecond))
	return b.String()
}
