package deploy

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// kustomization is the part of a Kustomization this directory uses; decoding it
// strictly makes any other field an error.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}

// strictDecoder decodes manifests with client-go's scheme, failing on unknown or
// duplicate fields.
var strictDecoder = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

func readKustomization(t *testing.T) kustomization {
	t.Helper()
	data, err := Manifests.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Fatalf("kustomization.yaml: apiVersion %q kind %q", k.APIVersion, k.Kind)
	}
	return k
}

// decodeAll decodes every resource the kustomization lists, strictly, keyed by kind.
func decodeAll(t *testing.T) map[string]runtime.Object {
	t.Helper()
	objs := map[string]runtime.Object{}
	for _, name := range readKustomization(t).Resources {
		data, err := Manifests.ReadFile(name)
		if err != nil {
			t.Fatalf("kustomization lists %s: %v", name, err)
		}
		obj, gvk, err := strictDecoder.Decode(data, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, dup := objs[gvk.Kind]; dup {
			t.Fatalf("%s: a second %s", name, gvk.Kind)
		}
		objs[gvk.Kind] = obj
	}
	return objs
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	files, err := fs.Glob(Manifests, "*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" })
	listed := slices.Clone(readKustomization(t).Resources)
	sort.Strings(files)
	sort.Strings(listed)
	if !slices.Equal(files, listed) {
		t.Fatalf("kustomization resources %v, manifests in deploy/ %v", listed, files)
	}
	want := []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"}
	objs := decodeAll(t)
	var got []string
	for k := range objs {
		got = append(got, k)
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
}

func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	data, err := Manifests.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(data, []byte("      hostNetwork: true\n"), []byte("      hostNetwork: true\n      hostNetwrok: true\n"), 1)
	if bytes.Equal(bad, data) {
		t.Fatal("could not inject a misspelt field")
	}
	if _, _, err := strictDecoder.Decode(bad, nil, nil); err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
		t.Fatalf("misspelt field decoded with err %v, want a strict decoding error naming it", err)
	}
}

func TestDaemonSetSecurity(t *testing.T) {
	objs := decodeAll(t)
	ds := objs["DaemonSet"].(*appsv1.DaemonSet)
	sa := objs["ServiceAccount"].(*v1.ServiceAccount)
	cm := objs["ConfigMap"].(*v1.ConfigMap)
	spec := ds.Spec.Template.Spec

	if !spec.HostNetwork {
		t.Error("hostNetwork is not set: nftproxy must program the node's namespace")
	}
	if spec.DNSPolicy != v1.DNSClusterFirstWithHostNet {
		t.Errorf("dnsPolicy %q, want %q", spec.DNSPolicy, v1.DNSClusterFirstWithHostNet)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q, want system-node-critical", spec.PriorityClassName)
	}
	if spec.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
		t.Errorf("serviceAccountName %s/%s, ServiceAccount is %s/%s", ds.Namespace, spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl v1.Toleration) bool {
		return tl.Operator == v1.TolerationOpExists && tl.Key == "" && tl.Effect == ""
	}) {
		t.Errorf("tolerations %v: want one with operator Exists and no key or effect", spec.Tolerations)
	}
	if spec.HostPID || spec.HostIPC {
		t.Error("hostPID or hostIPC is set")
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
		t.Fatalf("%d containers and %d init containers, want 1 and 0", len(spec.Containers), len(spec.InitContainers))
	}
	c := spec.Containers[0]

	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("no securityContext with capabilities")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("the container is privileged")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	added := slices.Clone(sc.Capabilities.Add)
	slices.Sort(added)
	if !slices.Equal(added, []v1.Capability{"NET_ADMIN", "NET_RAW"}) {
		t.Errorf("capabilities added %v, want exactly NET_ADMIN and NET_RAW", sc.Capabilities.Add)
	}

	args := append(slices.Clone(c.Command), c.Args...)
	for _, want := range []string{"--config=/etc/nftproxy/config.yaml", "--hostname-override=$(NODE_NAME)"} {
		if !slices.Contains(args, want) {
			t.Errorf("command line %v lacks %s", args, want)
		}
	}
	if !slices.ContainsFunc(c.Env, func(e v1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Error("no NODE_NAME from spec.nodeName")
	}

	port := healthzPort(t, cm)
	for name, p := range map[string]*v1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		want := map[string]string{"readiness": "/healthz", "liveness": "/livez"}[name]
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: not an httpGet", name)
			continue
		}
		if p.HTTPGet.Path != want || p.HTTPGet.Port.IntValue() != port {
			t.Errorf("%s probe: GET %s on port %s, want %s on the healthz port %d", name, p.HTTPGet.Path, p.HTTPGet.Port.String(), want, port)
		}
	}

	mounts := map[string]v1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	for _, vol := range spec.Volumes {
		m, ok := mounts[vol.Name]
		if !ok {
			t.Errorf("volume %s is not mounted", vol.Name)
			continue
		}
		if !m.ReadOnly {
			t.Errorf("volume %s is mounted read-write", vol.Name)
		}
		switch {
		case vol.ConfigMap != nil:
			if vol.ConfigMap.Name != cm.Name || m.MountPath != "/etc/nftproxy" {
				t.Errorf("config volume: ConfigMap %s at %s, want %s at /etc/nftproxy", vol.ConfigMap.Name, m.MountPath, cm.Name)
			}
		case vol.HostPath != nil:
			if vol.HostPath.Path != "/lib/modules" {
				t.Errorf("hostPath volume %s: %s, want only /lib/modules", vol.Name, vol.HostPath.Path)
			}
		default:
			t.Errorf("volume %s: unexpected kind", vol.Name)
		}
	}
	if len(spec.Volumes) != 2 || len(c.VolumeMounts) != 2 {
		t.Errorf("%d volumes and %d mounts, want the ConfigMap and /lib/modules", len(spec.Volumes), len(c.VolumeMounts))
	}
}

// healthzPort returns the port of the ConfigMap's healthzBindAddress.
func healthzPort(t *testing.T, cm *v1.ConfigMap) int {
	t.Helper()
	var cfg struct {
		HealthzBindAddress string `json:"healthzBindAddress"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.HealthzBindAddress != "0.0.0.0:10256" {
		t.Fatalf("healthzBindAddress %q, want 0.0.0.0:10256", cfg.HealthzBindAddress)
	}
	return 10256
}

func TestRBACCoversExactlyTheInformers(t *testing.T) {
	objs := decodeAll(t)
	role := objs["ClusterRole"].(*rbacv1.ClusterRole)
	binding := objs["ClusterRoleBinding"].(*rbacv1.ClusterRoleBinding)
	sa := objs["ServiceAccount"].(*v1.ServiceAccount)

	got := map[string][]string{} // "group/resource" -> sorted verbs
	for _, r := range role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %v: resourceNames or nonResourceURLs", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				key := g + "/" + res
				got[key] = append(got[key], r.Verbs...)
			}
		}
	}
	for k := range got {
		slices.Sort(got[k])
		got[k] = slices.Compact(got[k])
	}
	want := map[string][]string{
		"/services":                       {"list", "watch"},
		"discovery.k8s.io/endpointslices": {"list", "watch"},
		"/nodes":                          {"get", "list", "watch"},
		"/events":                         {"create", "patch"},
		"events.k8s.io/events":            {"create", "patch"},
	}
	if len(got) != len(want) {
		t.Errorf("rules grant %v, want %v", got, want)
	}
	for k, verbs := range want {
		if !slices.Equal(got[k], verbs) {
			t.Errorf("%s: verbs %v, want %v", k, got[k], verbs)
		}
	}

	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name {
		t.Errorf("binding refers to %s %s, want ClusterRole %s", binding.RoleRef.Kind, binding.RoleRef.Name, role.Name)
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0].Kind != "ServiceAccount" ||
		binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("binding subjects %v, want only ServiceAccount %s/%s", binding.Subjects, sa.Namespace, sa.Name)
	}
}

// TestConfigMapLoadsWithTheDaemon runs the daemon's own loader on the ConfigMap's
// file: nftproxy is built and started with the file and a kubeconfig that does not
// exist, so a valid configuration gets as far as connecting to the API server
// (nothing touches the kernel before that), and an invalid one fails before.
func TestConfigMapLoadsWithTheDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/nftproxy")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build cmd/nftproxy: ", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "nftproxy")
	if out, err := exec.Command(gobin, "build", "-o", bin, "github.com/nftproxy/nftproxy/cmd/nftproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/nftproxy: %v\n%s", err, out)
	}
	cm := decodeAll(t)["ConfigMap"].(*v1.ConfigMap)
	if len(cm.Data) != 1 || cm.Data["config.yaml"] == "" {
		t.Fatalf("ConfigMap data keys %v, want only config.yaml", keys(cm.Data))
	}
	run := func(config string) string {
		t.Helper()
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--config="+path, "--hostname-override=node-a",
			"--kubeconfig="+filepath.Join(dir, "missing-kubeconfig"))
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("nftproxy ran with a missing kubeconfig:\n%s", out)
		}
		return string(out)
	}

	out := run(cm.Data["config.yaml"])
	if strings.Contains(out, "nftproxy: ") || !strings.Contains(out, "API server configuration") {
		t.Fatalf("the ConfigMap's configuration did not load and validate:\n%s", out)
	}
	// The same check fails a broken file, so the one above means something.
	bad := strings.Replace(cm.Data["config.yaml"], "serviceCIDR: 10.96.0.0/12", "serviceCIDR: 10.96.0.0/99", 1)
	if out := run(bad); !strings.Contains(out, "invalid configuration") || !strings.Contains(out, "serviceCIDR") {
		t.Fatalf("a broken serviceCIDR was not reported:\n%s", out)
	}
	unknown := cm.Data["config.yaml"] + "tableNmae: x\n"
	if out := run(unknown); !strings.Contains(out, "tableNmae") {
		t.Fatalf("an unknown field was not reported:\n%s", out)
	}
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	for _, want := range []string{
		"FROM golang:1.26-bookworm AS build",
		"./cmd/nftproxy",
		"FROM debian:bookworm-slim",
		"apt-get install -y --no-install-recommends nftables conntrack",
		"COPY --from=build /out/nftproxy /usr/local/bin/nftproxy",
		`ENTRYPOINT ["/usr/local/bin/nftproxy"]`,
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if strings.Count(df, "\nFROM ")+strings.Count(df[:min(len(df), 5)], "FROM ") < 2 {
		t.Error("Dockerfile is not multi-stage")
	}
}
