package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// fakeAPIServer makes nftrace's API server a fake clientset holding the objects of
// the cluster file path, and returns a kubeconfig naming it (the fake ignores it)
// with two contexts: "e2e", the current one, and "other".
func fakeAPIServer(t *testing.T, path string, extra ...runtime.Object) (kubeconfig string, hosts *[]string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs := extra
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		var obj runtime.Object
		switch tm.Kind {
		case "Node":
			obj = &v1.Node{}
		case "Service":
			obj = &v1.Service{}
		case "EndpointSlice":
			obj = &discoveryv1.EndpointSlice{}
		case "ServiceCIDR":
			obj = &networkingv1.ServiceCIDR{}
		default:
			continue
		}
		if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, obj)
	}
	hosts = &[]string{}
	old := newClientset
	newClientset = func(cfg *rest.Config) (kubernetes.Interface, error) {
		*hosts = append(*hosts, cfg.Host)
		return fake.NewClientset(objs...), nil
	}
	t.Cleanup(func() { newClientset = old })
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "https://127.0.0.1:6443"}
- name: other
  cluster: {server: "https://127.0.0.2:6443"}
users:
- name: admin
  user: {token: secret}
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
- name: other
  context: {cluster: other, user: admin}
current-context: e2e
`), 0o600)
	return kubeconfig, hosts
}

// TestKubeconfigBuildsTheClustersRuleset: the objects listed from an API server go
// into the Proxier as a cluster file's do, so the two rulesets are the same.
func TestKubeconfigBuildsTheClustersRuleset(t *testing.T) {
	kubeconfig, hosts := fakeAPIServer(t, cluster)
	fromFile := runOut(t, "--print-ruleset")
	var live, errb bytes.Buffer
	if err := run(append(exampleCIDRs, "--kubeconfig", kubeconfig, "--print-ruleset"), &live, &errb); err != nil {
		t.Fatalf("--kubeconfig: %v\nstderr: %s", err, errb.String())
	}
	if live.String() != fromFile {
		t.Errorf("the ruleset built from the API server differs from the cluster file's:\n%s\nwant:\n%s", live.String(), fromFile)
	}
	if len(*hosts) != 1 || (*hosts)[0] != "https://127.0.0.1:6443" {
		t.Errorf("clients made for %v; want one for the current context's https://127.0.0.1:6443", *hosts)
	}
	res := runJSON(t, append(exampleCIDRs, "--kubeconfig", kubeconfig, "--node", "node-a", "tcp 10.1.0.9:40000 -> 172.30.0.10:80 iif veth1")...)
	if got := addrs(res[0]); res[0].Verdict != "accept" || len(got) != 2 || got["10.1.0.5:8080"] != 0.5 || got["10.2.0.5:8080"] != 0.5 {
		t.Errorf("pod -> web over the API server: verdict %s endpoints %v; want accept to 10.1.0.5:8080 and 10.2.0.5:8080 at 0.5", res[0].Verdict, got)
	}
}

// TestKubeconfigNodeAndCIDRs: --node must name a Node of the cluster; the CIDRs
// come from the cluster (the Nodes' podCIDRs, ServiceCIDRs) when not given.
func TestKubeconfigNodeAndCIDRs(t *testing.T) {
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"172.30.0.0/16"}}}
	kubeconfig, _ := fakeAPIServer(t, cluster, sc)
	var out, errb bytes.Buffer
	err := run([]string{"--kubeconfig", kubeconfig, "--node", "node-x", "tcp 10.1.0.9:40000 -> 172.30.0.10:80"}, &out, &errb)
	if want := "--node node-x: the API server https://127.0.0.1:6443 (context e2e) has no Node of that name; its Nodes: node-a"; err == nil || err.Error() != want {
		t.Errorf("--node node-x: error %v, want %q", err, want)
	}
	errb.Reset()
	res := func() []Result {
		out.Reset()
		if err := run([]string{"--kubeconfig", kubeconfig, "--json", "tcp 10.1.0.9:40000 -> 172.30.0.99:80 iif veth1"}, &out, &errb); err != nil {
			t.Fatalf("%v\nstderr: %s", err, errb.String())
		}
		return decodeResults(t, &out)
	}()
	for _, want := range []string{"clusterCIDR from the Nodes' spec.podCIDRs: 10.1.0.0/16,fd00:1::/64", "serviceCIDR from the ServiceCIDR objects: 172.30.0.0/16"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr %q lacks %q", errb.String(), want)
		}
	}
	if res[0].Verdict == "accept" {
		t.Errorf("an unallocated ClusterIP in the ServiceCIDR: verdict accept; want it dropped or rejected")
	}
}

// TestKubectlPlugin: as kubectl-nftrace, with no source given, nftrace reads the
// API server of kubectl's configuration: $KUBECONFIG, the current context or
// --context.
func TestKubectlPlugin(t *testing.T) {
	if !isPlugin("/usr/local/bin/kubectl-nftrace") || isPlugin("nftrace") {
		t.Errorf("isPlugin: want true for kubectl-nftrace only")
	}
	kubeconfig, hosts := fakeAPIServer(t, cluster)
	t.Setenv("KUBECONFIG", kubeconfig)
	pkt := "tcp 10.1.0.9:40000 -> 172.30.0.10:80 iif veth1"
	for _, args := range [][]string{{pkt}, {"--context", "other", pkt}} {
		var out, errb bytes.Buffer
		if err := runAs(true, append([]string{"-o", "summary"}, args...), &out, &errb); err != nil {
			t.Fatalf("kubectl nftrace %q: %v\nstderr: %s", args, err, errb.String())
		}
		if want := pkt + " => ACCEPT (forward) to 10.1.0.5:8080 (50%), 10.2.0.5:8080 (50%)\n"; out.String() != want {
			t.Errorf("kubectl nftrace %q: %q, want %q", args, out.String(), want)
		}
	}
	if want := []string{"https://127.0.0.1:6443", "https://127.0.0.2:6443"}; strings.Join(*hosts, " ") != strings.Join(want, " ") {
		t.Errorf("clients made for %v; want %v (the current context, then --context other)", *hosts, want)
	}
	// The plain command wants a source.
	if err := run([]string{pkt}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "--kubeconfig FILE") {
		t.Errorf("nftrace without a source: error %v, want one naming --kubeconfig", err)
	}
	var help bytes.Buffer
	if err := runAs(true, []string{"--help"}, &help, &bytes.Buffer{}); err != nil || !strings.HasPrefix(help.String(), "usage: kubectl nftrace") {
		t.Errorf("kubectl nftrace --help: %v, %q; want the plugin's usage", err, help.String())
	}
	if err := runAs(true, []string{"--context", "nope", pkt}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `context "nope"`) {
		t.Errorf("--context nope: error %v, want one naming the context", err)
	}
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	t.Setenv("HOME", t.TempDir())
	if err := runAs(true, []string{pkt}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "kubeconfig: none found: give --kubeconfig FILE") {
		t.Errorf("without a kubeconfig: error %v, want one saying how to give one", err)
	}
}
