package deploy

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// kustomizeValues are the values that make the chart what deploy/*.yaml are.
func kustomizeValues(t *testing.T) map[string]any {
	t.Helper()
	img := readKustomization(t).Images[0]
	return map[string]any{
		"apiServer": apiServerPlaceholder,
		"image":     map[string]any{"repository": img.NewName, "tag": img.NewTag},
	}
}

// decodeChart renders the chart with vals and decodes every manifest strictly with
// client-go's scheme, keyed by kind.
func decodeChart(t *testing.T, vals map[string]any) map[string]runtime.Object {
	t.Helper()
	out, err := RenderChart(vals)
	if err != nil {
		t.Fatalf("rendering the chart: %v", err)
	}
	objs := map[string]runtime.Object{}
	for name, doc := range out {
		for kind, obj := range decodeStream(t, []byte(doc)) {
			if _, dup := objs[kind]; dup {
				t.Fatalf("%s: a second %s", name, kind)
			}
			objs[kind] = obj
		}
	}
	return objs
}

// TestHelmChartIsTheKustomization renders the chart with the values that mirror
// deploy/*.yaml: the same kinds, decoded strictly, the same security properties,
// RBAC rules and files.
func TestHelmChartIsTheKustomization(t *testing.T) {
	want := decodeAll(t)
	got := decodeChart(t, kustomizeValues(t))
	if g, w := mapsKeys(got), mapsKeys(want); !slices.Equal(g, w) {
		t.Fatalf("chart renders %v, kustomization %v", g, w)
	}
	ds := got["DaemonSet"].(*appsv1.DaemonSet)
	cm := got["ConfigMap"].(*v1.ConfigMap)
	checkDaemonSet(t, ds, got["ServiceAccount"].(*v1.ServiceAccount), cm)
	if diff := cmp.Diff(securityOf(want["DaemonSet"].(*appsv1.DaemonSet)), securityOf(ds)); diff != "" {
		t.Errorf("security properties differ (-kustomize +helm):\n%s", diff)
	}
	if diff := cmp.Diff(want["ClusterRole"].(*rbacv1.ClusterRole).Rules, got["ClusterRole"].(*rbacv1.ClusterRole).Rules); diff != "" {
		t.Errorf("ClusterRole rules differ (-kustomize +helm):\n%s", diff)
	}
	b := got["ClusterRoleBinding"].(*rbacv1.ClusterRoleBinding)
	sa := got["ServiceAccount"].(*v1.ServiceAccount)
	if len(b.Subjects) != 1 || b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != sa.Namespace || b.RoleRef.Name != got["ClusterRole"].(*rbacv1.ClusterRole).Name {
		t.Errorf("binding %v to %s, want ServiceAccount %s/%s", b.Subjects, b.RoleRef.Name, sa.Namespace, sa.Name)
	}
	wantCM := want["ConfigMap"].(*v1.ConfigMap)
	if diff := cmp.Diff(keys(wantCM.Data), keys(cm.Data)); diff != "" {
		t.Errorf("ConfigMap keys differ (-kustomize +helm):\n%s", diff)
	}
	for _, k := range []string{"kubeconfig.conf", "conntrack-probe.nft"} {
		if diff := cmp.Diff(wantCM.Data[k], cm.Data[k]); diff != "" {
			t.Errorf("%s differs (-kustomize +helm):\n%s", k, diff)
		}
	}
	checkKubeconfig(t, cm.Data["kubeconfig.conf"], apiServerPlaceholder)
	if diff := cmp.Diff(parseConfig(t, wantCM.Data["config.yaml"]), parseConfig(t, cm.Data["config.yaml"])); diff != "" {
		t.Errorf("config.yaml differs (-kustomize +helm):\n%s", diff)
	}
	img := readKustomization(t).Images[0]
	for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
		if c.Image != img.NewName+":"+img.NewTag {
			t.Errorf("container %s: image %q, want %s:%s", c.Name, c.Image, img.NewName, img.NewTag)
		}
	}
	if ds.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a changed ConfigMap would not restart the pods")
	}
}

func parseConfig(t *testing.T, data string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(data), &m); err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	return m
}

func mapsKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestHelmRequiredValues: without the API server's address or the image the chart
// does not render, and says which value to set.
func TestHelmRequiredValues(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		edit       func(map[string]any)
	}{
		{"no apiServer", "apiServer is required", func(v map[string]any) { delete(v, "apiServer") }},
		{"apiServer not https", "/apiServer", func(v map[string]any) { v["apiServer"] = "10.0.0.1:6443" }},
		{"no image", "image.repository is required", func(v map[string]any) { delete(v, "image") }},
		{"misspelt value", "apiserver", func(v map[string]any) { v["apiserver"] = v["apiServer"] }},
		{"apiServer with a path", "/apiServer", func(v map[string]any) { v["apiServer"] = "https://10.0.0.1:6443/x" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := kustomizeValues(t)
			tc.edit(vals)
			_, err := RenderChart(vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("rendered with err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestHelmValues: the values an operator sets reach the objects.
func TestHelmValues(t *testing.T) {
	vals := kustomizeValues(t)
	vals["apiServer"] = "https://10.0.0.10:6443"
	vals["image"].(map[string]any)["tag"] = "v1.2.3"
	vals["config"] = map[string]any{"clusterCIDR": "10.1.0.0/16,fd00::/56", "healthzBindAddress": "0.0.0.0:10300"}
	vals["resources"] = map[string]any{"requests": map[string]any{"cpu": "200m", "memory": "1Gi"}, "limits": map[string]any{"memory": "3Gi"}}
	vals["tolerations"] = []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "edge", "effect": "NoSchedule"}}
	vals["nodeSelector"] = map[string]any{"nftproxy.io/proxy": "nftproxy"}
	vals["conntrackInit"] = map[string]any{"enabled": false}
	vals["extraArgs"] = []any{"--v=2"}
	objs := decodeChart(t, vals)
	ds := objs["DaemonSet"].(*appsv1.DaemonSet)
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	cm := objs["ConfigMap"].(*v1.ConfigMap)

	checkKubeconfig(t, cm.Data["kubeconfig.conf"], "https://10.0.0.10:6443")
	cfg := parseConfig(t, cm.Data["config.yaml"])
	if cfg["clusterCIDR"] != "10.1.0.0/16,fd00::/56" || cfg["serviceCIDR"] != "10.96.0.0/12" || cfg["kind"] != "NftproxyConfiguration" {
		t.Errorf("config.yaml %v: want clusterCIDR set, serviceCIDR kept from values.yaml", cfg)
	}
	if c.Image != "registry.example/nftproxy:v1.2.3" {
		t.Errorf("image %q", c.Image)
	}
	if c.ReadinessProbe.HTTPGet.Port.IntValue() != 10300 || c.LivenessProbe.HTTPGet.Port.IntValue() != 10300 || c.Ports[0].ContainerPort != 10300 {
		t.Errorf("probes and port do not follow healthzBindAddress 0.0.0.0:10300")
	}
	if got := c.Resources.Limits.Memory().String(); got != "3Gi" {
		t.Errorf("memory limit %s, want 3Gi", got)
	}
	if _, ok := c.Resources.Limits[v1.ResourceCPU]; ok {
		t.Error("a CPU limit from values that set none")
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" {
		t.Errorf("tolerations %v", spec.Tolerations)
	}
	// Helm merges maps with values.yaml's: the os selector stays.
	if !reflect.DeepEqual(spec.NodeSelector, map[string]string{"kubernetes.io/os": "linux", "nftproxy.io/proxy": "nftproxy"}) {
		t.Errorf("nodeSelector %v", spec.NodeSelector)
	}
	// Without the conntrack sysctls there is no init container; the daemon takes the
	// node over from kube-proxy itself, unless cleanupKubeProxy is false.
	if len(spec.InitContainers) != 0 {
		t.Errorf("%d init containers with conntrackInit.enabled false, want none", len(spec.InitContainers))
	}
	if !slices.Contains(c.Command, takeoverFlag) {
		t.Errorf("command %v lacks %s", c.Command, takeoverFlag)
	}
	if !slices.Contains(c.Command, iptablesTakeoverFlag) {
		t.Errorf("command %v lacks %s", c.Command, iptablesTakeoverFlag)
	}
	vals["cleanupKubeProxy"], vals["cleanupKubeProxyIptables"] = false, false
	objs = decodeChart(t, vals)
	without := objs["DaemonSet"].(*appsv1.DaemonSet)
	if cmd := without.Spec.Template.Spec.Containers[0].Command; slices.Contains(cmd, takeoverFlag) || slices.Contains(cmd, iptablesTakeoverFlag) {
		t.Errorf("command %v has %s or %s with cleanupKubeProxy and cleanupKubeProxyIptables false", cmd, takeoverFlag, iptablesTakeoverFlag)
	}
	// Without the iptables cleanup, no lock volume, mount or variable.
	sec := securityOf(without)
	if len(sec.Volumes) != 1 || len(sec.Containers[0].Mounts) != 1 || len(without.Spec.Template.Spec.Containers[0].Env) != 1 {
		t.Errorf("volumes %v, mounts %v, env %v: want the config's and NODE_NAME only with cleanupKubeProxyIptables false",
			sec.Volumes, sec.Containers[0].Mounts, without.Spec.Template.Spec.Containers[0].Env)
	}
	if !slices.Contains(c.Command, "--v=2") {
		t.Errorf("command %v lacks the extra argument", c.Command)
	}
}
