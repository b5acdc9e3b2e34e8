package deploy

import (
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"
)

// migrationLabel is the node label that moves a node from kube-proxy to nftproxy.
const migrationLabel = "nftproxy.io/proxy"

// kubeadmKubeProxy is kube-proxy's DaemonSet as kubeadm makes it, in the parts that
// decide where it runs.
const kubeadmKubeProxy = `
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels: {k8s-app: kube-proxy}
spec:
  selector:
    matchLabels: {k8s-app: kube-proxy}
  template:
    metadata:
      labels: {k8s-app: kube-proxy}
    spec:
      hostNetwork: true
      nodeSelector:
        kubernetes.io/os: linux
      tolerations:
      - operator: Exists
      priorityClassName: system-node-critical
      serviceAccountName: kube-proxy
      containers:
      - name: kube-proxy
        image: registry.k8s.io/kube-proxy:v1.37.2
        command: [/usr/local/bin/kube-proxy, --config=/var/lib/kube-proxy/config.conf, --hostname-override=$(NODE_NAME)]
        securityContext:
          privileged: true
`

// schedules reports whether the DaemonSet controller places spec's pod on a node of
// these labels (its nodeSelector and required node affinity; every node tolerated).
func schedules(t *testing.T, spec v1.PodSpec, node map[string]string) bool {
	t.Helper()
	if !labels.SelectorFromSet(spec.NodeSelector).Matches(labels.Set(node)) {
		return false
	}
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	ops := map[v1.NodeSelectorOperator]selection.Operator{
		v1.NodeSelectorOpIn: selection.In, v1.NodeSelectorOpNotIn: selection.NotIn,
		v1.NodeSelectorOpExists: selection.Exists, v1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	}
	for _, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		sel := labels.NewSelector()
		for _, e := range term.MatchExpressions {
			op, ok := ops[e.Operator]
			if !ok {
				t.Fatalf("node affinity operator %s not handled by the test", e.Operator)
			}
			r, err := labels.NewRequirement(e.Key, op, e.Values)
			if err != nil {
				t.Fatal(err)
			}
			sel = sel.Add(*r)
		}
		if len(term.MatchFields) == 0 && sel.Matches(labels.Set(node)) {
			return true
		}
	}
	return false
}

// TestMigrationNeverRunsBothProxies patches kubeadm's kube-proxy DaemonSet with
// migration/kube-proxy-patch.yaml, as deploy/README.md says, and takes nftproxy's
// DaemonSet with the migration nodeSelector (daemonset.yaml's commented line, and
// the Helm value): on every node exactly one of the two runs, nftproxy where the
// label says so.
func TestMigrationNeverRunsBothProxies(t *testing.T) {
	patch, err := os.ReadFile("migration/kube-proxy-patch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	patchJSON, err := yaml.YAMLToJSON(patch)
	if err != nil {
		t.Fatal(err)
	}
	origJSON, err := yaml.YAMLToJSON([]byte(kubeadmKubeProxy))
	if err != nil {
		t.Fatal(err)
	}
	patched, err := strategicpatch.StrategicMergePatch(origJSON, patchJSON, appsv1.DaemonSet{})
	if err != nil {
		t.Fatalf("kube-proxy-patch.yaml: %v", err)
	}
	kp, _, err := strictDecoder.Decode(patched, nil, nil)
	if err != nil {
		t.Fatalf("patched kube-proxy DaemonSet: %v", err)
	}
	kubeProxy := kp.(*appsv1.DaemonSet).Spec.Template.Spec
	if kubeProxy.NodeSelector["kubernetes.io/os"] != "linux" || len(kubeProxy.Containers) != 1 {
		t.Errorf("the patch lost kube-proxy's own spec: %+v", kubeProxy)
	}

	data, err := Manifests.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	commented := "# " + migrationLabel + ": nftproxy\n"
	if !strings.Contains(string(data), commented) {
		t.Fatalf("daemonset.yaml has no commented %q", commented)
	}
	obj, _, err := strictDecoder.Decode([]byte(strings.Replace(string(data), commented, migrationLabel+": nftproxy\n", 1)), nil, nil)
	if err != nil {
		t.Fatalf("daemonset.yaml with the migration nodeSelector: %v", err)
	}
	vals := kustomizeValues(t)
	vals["nodeSelector"] = map[string]any{migrationLabel: "nftproxy"}
	nftproxies := map[string]v1.PodSpec{
		"kustomize": obj.(*appsv1.DaemonSet).Spec.Template.Spec,
		"helm":      decodeChart(t, vals)["DaemonSet"].(*appsv1.DaemonSet).Spec.Template.Spec,
	}
	for name, nftproxy := range nftproxies {
		for _, node := range []struct {
			labels  map[string]string
			nftprox bool
		}{
			{map[string]string{"kubernetes.io/os": "linux"}, false},
			{map[string]string{"kubernetes.io/os": "linux", migrationLabel: "nftproxy"}, true},
			{map[string]string{"kubernetes.io/os": "linux", migrationLabel: "kube-proxy"}, false},
		} {
			n, k := schedules(t, nftproxy, node.labels), schedules(t, kubeProxy, node.labels)
			if n != node.nftprox || k == n {
				t.Errorf("%s: node %v runs nftproxy %v, kube-proxy %v; want nftproxy %v and never both or neither", name, node.labels, n, k, node.nftprox)
			}
		}
	}
	// Without the migration nodeSelector nftproxy runs on every Linux node.
	ds := decodeAll(t)["DaemonSet"].(*appsv1.DaemonSet)
	if !schedules(t, ds.Spec.Template.Spec, map[string]string{"kubernetes.io/os": "linux"}) {
		t.Error("the default DaemonSet does not run on an unlabelled Linux node")
	}
}
