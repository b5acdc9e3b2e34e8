package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/internal/testenv"
)

// nftraceResult is the part of nftrace's JSON output (tools/nftrace Result) the
// spec checks.
type nftraceResult struct {
	Packet    string `json:"packet"`
	Verdict   string `json:"verdict"`
	Delivery  string `json:"delivery"`
	Endpoints []struct {
		Address     string  `json:"address"`
		Probability float64 `json:"probability"`
		Masquerade  bool    `json:"masquerade"`
	} `json:"endpoints"`
}

// The live cluster nftrace reads: one Node, a NodePort Service with two endpoints
// on it.
const (
	nftraceNode     = "node-t"
	nftraceNodeIP   = "192.168.88.1"
	nftracePodCIDR  = "10.0.2.0/24"
	nftraceSvcIP    = "172.30.0.20"
	nftraceNodePort = 30080
)

var _ = Describe("nftrace against a live cluster's API server", Label("apiserver", "nftrace"), Ordered, func() {
	var (
		ns     *lab.NS
		cp     *ControlPlane
		client kubernetes.Interface
		bin    string
	)

	BeforeAll(func(ctx SpecContext) {
		if why := testenv.Missing(); why != "" {
			Skip("the nftrace spec of the apiserver suite " + why)
		}
		apiserverBin, etcdBin, err := Binaries()
		if err != nil {
			Skip("the nftrace spec needs kube-apiserver and etcd: " + err.Error())
		}
		workDir := GinkgoT().TempDir()

		By("building nftrace as the kubectl plugin kubectl-nftrace")
		bin = filepath.Join(workDir, "kubectl-nftrace")
		out, err := exec.Command("go", "build", "-o", bin, "github.com/nftproxy/nftproxy/tools/nftrace").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "go build ./tools/nftrace:\n%s", out)

		By("starting etcd and kube-apiserver in a namespace of their own")
		ns, err = lab.NewNS(fmt.Sprintf("%snftrace-%d", lab.NamePrefix, os.Getpid()))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(ns.Close()).To(Succeed()) })
		cp, err = StartControlPlane(ctx, ns, workDir, apiserverBin, etcdBin)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(cp.Stop)
		client, err = kubernetes.NewForConfig(cp.RESTConfig())
		Expect(err).NotTo(HaveOccurred())

		By("creating the Node, a NodePort Service and its EndpointSlice")
		node := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: nftraceNode},
			Spec:       v1.NodeSpec{PodCIDR: nftracePodCIDR, PodCIDRs: []string{nftracePodCIDR}},
		}
		created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		created.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: nftraceNodeIP}}
		_, err = client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred())
		_, err = client.CoreV1().Services("default").Create(ctx, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "traced", Namespace: "default"},
			Spec: v1.ServiceSpec{
				Type:      v1.ServiceTypeNodePort,
				ClusterIP: nftraceSvcIP,
				Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80,
					TargetPort: intstr.FromInt32(8080), NodePort: nftraceNodePort}},
			},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		var eps []discoveryv1.Endpoint
		for _, a := range []string{"10.0.2.6", "10.0.2.7"} {
			eps = append(eps, discoveryv1.Endpoint{Addresses: []string{a}, NodeName: ptr.To(nftraceNode),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		_, err = client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "traced-abc12", Namespace: "default",
				Labels: map[string]string{discoveryv1.LabelServiceName: "traced"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   eps,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
	})

	// nftrace runs the plugin in the control plane's namespace, where the
	// kubeconfig's server (the namespace's loopback) is reachable, with env added
	// to its environment; it returns the decoded results and the standard error.
	nftrace := func(ctx context.Context, env []string, args ...string) ([]nftraceResult, string) {
		GinkgoHelper()
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, append([]string{"--json"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		Expect(ns.Do(cmd.Run)).To(Succeed(), "kubectl-nftrace %s:\n%s", strings.Join(args, " "), stderr.String())
		fmt.Fprintf(GinkgoWriter, "kubectl-nftrace %s:\n%s", strings.Join(args, " "), stderr.String())
		var res []nftraceResult
		dec := json.NewDecoder(&stdout)
		for dec.More() {
			var r nftraceResult
			Expect(dec.Decode(&r)).To(Succeed())
			fmt.Fprintf(GinkgoWriter, "  %s => %s %v\n", r.Packet, r.Verdict, r.Endpoints)
			res = append(res, r)
		}
		return res, stderr.String()
	}

	endpoints := func(r nftraceResult) map[string]float64 {
		m := map[string]float64{}
		for _, e := range r.Endpoints {
			m[e.Address] = e.Probability
		}
		return m
	}

	const (
		podToClusterIP = "tcp 10.0.2.5:40000 -> " + nftraceSvcIP + ":80 iif veth0"
		outsideToNode  = "tcp 203.0.113.9:40001 -> 192.168.88.1:30080 iif eth0"
		podToNowhere   = "tcp 10.0.2.5:40002 -> 172.30.0.99:80 iif veth0"
	)

	It("traces the node's ruleset built from the API server's objects (--kubeconfig, --node)", func(ctx SpecContext) {
		res, stderr := nftrace(ctx, nil, "--kubeconfig", cp.Kubeconfig, "--node", nftraceNode, podToClusterIP, outsideToNode)
		Expect(res).To(HaveLen(2))
		Expect(res[0].Verdict).To(Equal("accept"), "a pod to the ClusterIP")
		Expect(res[0].Delivery).To(Equal("forward"))
		Expect(endpoints(res[0])).To(Equal(map[string]float64{"10.0.2.6:8080": 0.5, "10.0.2.7:8080": 0.5}))
		Expect(res[1].Verdict).To(Equal("accept"), "an outside client on the NodePort of the Node's InternalIP")
		Expect(endpoints(res[1])).To(Equal(map[string]float64{"10.0.2.6:8080": 0.5, "10.0.2.7:8080": 0.5}))
		for _, e := range res[1].Endpoints {
			Expect(e.Masquerade).To(BeTrue(), "NodePort traffic from outside is masqueraded")
		}
		Expect(stderr).To(ContainSubstring("clusterCIDR from the Nodes' spec.podCIDRs: " + nftracePodCIDR))
	})

	It("is the kubectl plugin: KUBECONFIG and the current context, the only Node", func(ctx SpecContext) {
		res, _ := nftrace(ctx, []string{"KUBECONFIG=" + cp.Kubeconfig}, podToClusterIP)
		Expect(res).To(HaveLen(1))
		Expect(res[0].Verdict).To(Equal("accept"))
		Expect(endpoints(res[0])).To(Equal(map[string]float64{"10.0.2.6:8080": 0.5, "10.0.2.7:8080": 0.5}))
	})

	It("takes the service CIDR from the API server's ServiceCIDR objects", func(ctx SpecContext) {
		// The API server makes its default ServiceCIDR from --service-cluster-ip-range,
		// shortly after it starts.
		Eventually(func(g Gomega) {
			l, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(l.Items).NotTo(BeEmpty())
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
		res, stderr := nftrace(ctx, nil, "--kubeconfig", cp.Kubeconfig, podToNowhere)
		Expect(stderr).To(ContainSubstring("serviceCIDR from the ServiceCIDR objects: " + ServiceCIDR))
		Expect(res).To(HaveLen(1))
		Expect(res[0].Verdict).NotTo(Equal("accept"), "an unallocated ClusterIP of the service CIDR is not passed on")
	})

	It("names the cluster's Nodes when --node names none of them", func(ctx SpecContext) {
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, "--kubeconfig", cp.Kubeconfig, "--node", "node-typo", podToClusterIP)
		cmd.Stderr = &stderr
		Expect(ns.Do(cmd.Run)).NotTo(Succeed())
		Expect(stderr.String()).To(ContainSubstring("--node node-typo: the API server https://127.0.0.1:6443 (context e2e) has no Node of that name; its Nodes: " + nftraceNode))
	})
})
