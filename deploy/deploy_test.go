package deploy

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/lab"
	"github.com/nftproxy/nftproxy/internal/testenv"
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

// The ServiceAccount token and CA the kubelet projects into every pod.
const (
	saTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	saCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// apiServerPlaceholder is the API server address the manifests ship with: a name that
// never resolves (.example), which deploy/README.md tells the operator to replace.
const apiServerPlaceholder = "https://control-plane.example:6443"

// security is what an operator reviews in the DaemonSet: how the pod reaches the node
// and the API server, what its containers may do, and what they mount. Two renderings
// of the manifests (kustomize, Helm) must give equal values.
type security struct {
	HostNetwork, HostPID, HostIPC bool
	DNSPolicy                     v1.DNSPolicy
	PriorityClass                 string
	Tolerations                   []v1.Toleration
	AutomountToken                bool
	Containers                    []containerSecurity
	Volumes                       []string // name: kind source
}

type containerSecurity struct {
	Name                                   string
	Init                                   bool
	Privileged, Escalation, ReadOnlyRoot   bool
	RunAsUser                              *int64
	Add, Drop                              []v1.Capability
	Seccomp                                v1.SeccompProfileType
	Mounts                                 []string // name:path:ro|rw
	Kubeconfig                             string
	Ports                                  []int32
	MemoryLimit, MemoryRequest, CPURequest string
	CPULimit                               string
}

func securityOf(ds *appsv1.DaemonSet) security {
	spec := ds.Spec.Template.Spec
	s := security{
		HostNetwork: spec.HostNetwork, HostPID: spec.HostPID, HostIPC: spec.HostIPC,
		DNSPolicy: spec.DNSPolicy, PriorityClass: spec.PriorityClassName, Tolerations: spec.Tolerations,
		AutomountToken: spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken,
	}
	for _, vol := range spec.Volumes {
		switch {
		case vol.ConfigMap != nil:
			s.Volumes = append(s.Volumes, vol.Name+": configMap "+vol.ConfigMap.Name)
		case vol.HostPath != nil:
			s.Volumes = append(s.Volumes, vol.Name+": hostPath "+vol.HostPath.Path)
		case vol.EmptyDir != nil:
			s.Volumes = append(s.Volumes, vol.Name+": emptyDir")
		default:
			s.Volumes = append(s.Volumes, vol.Name+": other")
		}
	}
	add := func(c v1.Container, init bool) {
		cs := containerSecurity{Name: c.Name, Init: init}
		if sc := c.SecurityContext; sc != nil {
			cs.Privileged = sc.Privileged != nil && *sc.Privileged
			cs.Escalation = sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation
			cs.ReadOnlyRoot = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
			cs.RunAsUser = sc.RunAsUser
			if sc.Capabilities != nil {
				cs.Add = slices.Sorted(slices.Values(sc.Capabilities.Add))
				cs.Drop = slices.Sorted(slices.Values(sc.Capabilities.Drop))
			}
			if sc.SeccompProfile != nil {
				cs.Seccomp = sc.SeccompProfile.Type
			}
		} else {
			cs.Escalation = true
		}
		for _, m := range c.VolumeMounts {
			mode := "rw"
			if m.ReadOnly {
				mode = "ro"
			}
			cs.Mounts = append(cs.Mounts, m.Name+":"+m.MountPath+":"+mode)
		}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			if k, ok := strings.CutPrefix(a, "--kubeconfig="); ok {
				cs.Kubeconfig = k
			}
		}
		for _, p := range c.Ports {
			cs.Ports = append(cs.Ports, p.ContainerPort)
		}
		q := func(l v1.ResourceList, n v1.ResourceName) string {
			if v, ok := l[n]; ok {
				return v.String()
			}
			return ""
		}
		cs.CPURequest, cs.MemoryRequest = q(c.Resources.Requests, v1.ResourceCPU), q(c.Resources.Requests, v1.ResourceMemory)
		cs.CPULimit, cs.MemoryLimit = q(c.Resources.Limits, v1.ResourceCPU), q(c.Resources.Limits, v1.ResourceMemory)
		s.Containers = append(s.Containers, cs)
	}
	for _, c := range spec.InitContainers {
		add(c, true)
	}
	for _, c := range spec.Containers {
		add(c, false)
	}
	return s
}

// checkDaemonSet checks what the DaemonSet must hold whatever renders it: the
// security properties, the node name, the kubeconfig and the probes.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, sa *v1.ServiceAccount, cm *v1.ConfigMap) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	sec := securityOf(ds)

	if !spec.HostNetwork {
		t.Error("hostNetwork is not set: nftproxy must program the node's namespace")
	}
	// Cluster DNS is a ClusterIP: the proxy must not need itself to resolve names.
	if spec.DNSPolicy != v1.DNSDefault {
		t.Errorf("dnsPolicy %q, want %q", spec.DNSPolicy, v1.DNSDefault)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q, want system-node-critical", spec.PriorityClassName)
	}
	if spec.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
		t.Errorf("serviceAccountName %s/%s, ServiceAccount is %s/%s", ds.Namespace, spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	if !sec.AutomountToken || (sa.AutomountServiceAccountToken != nil && !*sa.AutomountServiceAccountToken) {
		t.Error("the ServiceAccount token is not mounted: the kubeconfig reads it")
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl v1.Toleration) bool {
		return tl.Operator == v1.TolerationOpExists && tl.Key == "" && tl.Effect == ""
	}) {
		t.Errorf("tolerations %v: want one with operator Exists and no key or effect", spec.Tolerations)
	}
	if spec.HostPID || spec.HostIPC {
		t.Error("hostPID or hostIPC is set")
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) > 1 {
		t.Fatalf("%d containers and %d init containers, want 1 and at most 1", len(spec.Containers), len(spec.InitContainers))
	}
	c := spec.Containers[0]
	wantVolumes, wantMounts := []string{"config: configMap " + cm.Name}, []string{"config:/etc/nftproxy:ro"}
	if slices.Contains(c.Command, iptablesTakeoverFlag) {
		// iptables-legacy's lock file, in the pod's own emptyDir.
		wantVolumes = append(wantVolumes, "xtables-lock: emptyDir")
		wantMounts = append(wantMounts, "xtables-lock:/run/xtables-lock:rw")
		if !slices.ContainsFunc(c.Env, func(e v1.EnvVar) bool {
			return e.Name == "XTABLES_LOCKFILE" && strings.HasPrefix(e.Value, "/run/xtables-lock/")
		}) {
			t.Errorf("env %v: want XTABLES_LOCKFILE in /run/xtables-lock/ with %s", c.Env, iptablesTakeoverFlag)
		}
	}
	if !slices.Equal(sec.Volumes, wantVolumes) {
		t.Errorf("volumes %v, want only %v (no hostPath)", sec.Volumes, wantVolumes)
	}
	cs := sec.Containers[len(sec.Containers)-1]
	if cs.Privileged || cs.Escalation {
		t.Errorf("container %s: privileged %v, allowPrivilegeEscalation %v: want both false", c.Name, cs.Privileged, cs.Escalation)
	}
	if !slices.Equal(cs.Drop, []v1.Capability{"ALL"}) || !slices.Equal(cs.Add, []v1.Capability{"NET_ADMIN", "NET_RAW"}) {
		t.Errorf("capabilities drop %v add %v, want drop ALL and add exactly NET_ADMIN and NET_RAW", cs.Drop, cs.Add)
	}
	if cs.Seccomp != v1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile %q, want RuntimeDefault", cs.Seccomp)
	}
	if !cs.ReadOnlyRoot {
		t.Error("readOnlyRootFilesystem is not true")
	}
	// Added capabilities reach the effective set of uid 0 only.
	if cs.RunAsUser == nil || *cs.RunAsUser != 0 {
		t.Error("runAsUser is not 0")
	}
	if !slices.Equal(cs.Mounts, wantMounts) {
		t.Errorf("mounts %v, want %v", cs.Mounts, wantMounts)
	}
	if cs.Kubeconfig != "/etc/nftproxy/kubeconfig.conf" {
		t.Errorf("--kubeconfig %q, want /etc/nftproxy/kubeconfig.conf (in-cluster configuration needs a ClusterIP)", cs.Kubeconfig)
	}
	if cs.CPURequest == "" || cs.MemoryRequest == "" || cs.MemoryLimit == "" {
		t.Errorf("resources: cpu request %q, memory request %q and limit %q: want all set", cs.CPURequest, cs.MemoryRequest, cs.MemoryLimit)
	}
	if cs.CPULimit != "" {
		t.Errorf("a CPU limit (%s): throttling only delays syncs", cs.CPULimit)
	}

	args := append(slices.Clone(c.Command), c.Args...)
	for _, want := range []string{"--config=/etc/nftproxy/config.yaml", "--hostname-override=$(NODE_NAME)"} {
		if !slices.Contains(args, want) {
			t.Errorf("command line %v lacks %s", args, want)
		}
	}
	if !hasNodeName(c) {
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

	// The init container, when there is one, is the only privileged part: it sets
	// the conntrack sysctls with --init-only and exits.
	for i, ic := range spec.InitContainers {
		is := sec.Containers[i]
		script := strings.Join(append(slices.Clone(ic.Command), ic.Args...), " ")
		want := []string{"nft -f /etc/nftproxy/conntrack-probe.nft", "--config=/etc/nftproxy/config.yaml", "--init-only"}
		if !is.Privileged {
			t.Errorf("init container %s: not privileged, so it cannot set the conntrack sysctls: %+v", ic.Name, is)
		}
		for _, w := range want {
			if !strings.Contains(script, w) {
				t.Errorf("init container %s: command %q lacks %q", ic.Name, script, w)
			}
		}
		if !hasNodeName(ic) {
			t.Errorf("init container %s: no NODE_NAME from spec.nodeName", ic.Name)
		}
		if !is.ReadOnlyRoot || !slices.Equal(is.Mounts, []string{"config:/etc/nftproxy:ro"}) {
			t.Errorf("init container %s: readOnlyRootFilesystem %v, mounts %v", ic.Name, is.ReadOnlyRoot, is.Mounts)
		}
		if ic.Image != c.Image {
			t.Errorf("init container image %q, container image %q: want one image", ic.Image, c.Image)
		}
	}
}

// takeoverFlag makes the daemon delete kube-proxy's nftables tables once its own rules
// are in place.
const takeoverFlag = "--cleanup-table-after-sync=kube-proxy"

// iptablesTakeoverFlag makes it remove kube-proxy's iptables-mode chains at the same
// moment.
const iptablesTakeoverFlag = "--cleanup-kube-proxy-iptables"

func hasNodeName(c v1.Container) bool {
	return slices.ContainsFunc(c.Env, func(e v1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	})
}

func TestDaemonSetSecurity(t *testing.T) {
	objs := decodeAll(t)
	ds := objs["DaemonSet"].(*appsv1.DaemonSet)
	checkDaemonSet(t, ds, objs["ServiceAccount"].(*v1.ServiceAccount), objs["ConfigMap"].(*v1.ConfigMap))
	if ics := ds.Spec.Template.Spec.InitContainers; len(ics) != 1 || ics[0].Name != "conntrack-sysctls" {
		t.Errorf("init containers %v: want the conntrack-sysctls one", ics)
	}
	for _, flag := range []string{takeoverFlag, iptablesTakeoverFlag} {
		if c := ds.Spec.Template.Spec.Containers[0]; !slices.Contains(c.Command, flag) {
			t.Errorf("command %v: want %s, which takes the node over from kube-proxy", c.Command, flag)
		}
	}
	// The image is set in kustomization.yaml only: the manifests name it bare.
	for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
		if c.Image != "nftproxy" {
			t.Errorf("container %s: image %q, want the bare name nftproxy that kustomization.yaml sets", c.Name, c.Image)
		}
	}
}

// TestKubeconfig loads the ConfigMap's kubeconfig.conf with client-go, as the daemon
// does: it must name the API server by its own address, and the projected
// ServiceAccount token and CA.
func TestKubeconfig(t *testing.T) {
	cm := decodeAll(t)["ConfigMap"].(*v1.ConfigMap)
	checkKubeconfig(t, cm.Data["kubeconfig.conf"], apiServerPlaceholder)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), apiServerPlaceholder) {
		t.Errorf("README.md does not say where to set the API server (%s)", apiServerPlaceholder)
	}
}

func checkKubeconfig(t *testing.T, data, server string) {
	t.Helper()
	if data == "" {
		t.Fatal("no kubeconfig.conf")
	}
	raw, err := clientcmd.Load([]byte(data))
	if err != nil {
		t.Fatalf("kubeconfig.conf: %v", err)
	}
	// client-go checks that the files exist: stand them in a directory of the test's,
	// then map the paths back.
	dir := t.TempDir()
	for _, f := range []string{saTokenFile, saCAFile} {
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	moved := func(path string) string {
		if filepath.Dir(path) == filepath.Dir(saTokenFile) {
			return filepath.Join(dir, filepath.Base(path))
		}
		return path
	}
	for _, c := range raw.Clusters {
		c.CertificateAuthority = moved(c.CertificateAuthority)
	}
	for _, a := range raw.AuthInfos {
		a.TokenFile = moved(a.TokenFile)
	}
	if err := clientcmd.Validate(*raw); err != nil {
		t.Fatalf("kubeconfig.conf: %v", err)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*raw, nil).ClientConfig()
	if err != nil {
		t.Fatalf("kubeconfig.conf: %v", err)
	}
	back := func(path string) string {
		if filepath.Dir(path) == dir {
			return filepath.Join(filepath.Dir(saTokenFile), filepath.Base(path))
		}
		return path
	}
	cfg.BearerTokenFile, cfg.TLSClientConfig.CAFile = back(cfg.BearerTokenFile), back(cfg.TLSClientConfig.CAFile)
	if cfg.Host != server {
		t.Errorf("server %q, want %q", cfg.Host, server)
	}
	// A token written in the file would not rotate: only the file may give one.
	for name, a := range raw.AuthInfos {
		if a.Token != "" || a.ClientCertificate != "" || a.ClientCertificateData != nil || a.Exec != nil || a.AuthProvider != nil {
			t.Errorf("user %s: credentials other than the token file", name)
		}
	}
	if cfg.BearerTokenFile != saTokenFile {
		t.Errorf("token file %q, want the projected %s", cfg.BearerTokenFile, saTokenFile)
	}
	if cfg.TLSClientConfig.CAFile != saCAFile || cfg.TLSClientConfig.Insecure {
		t.Errorf("CA file %q (insecure %v), want the projected %s", cfg.TLSClientConfig.CAFile, cfg.TLSClientConfig.Insecure, saCAFile)
	}
	// Nothing may lead back to a ClusterIP: no in-cluster fallback, no proxy.
	if strings.Contains(cfg.Host, "kubernetes.default") || cfg.Proxy != nil {
		t.Errorf("server %q reaches the API server through the cluster", cfg.Host)
	}
}

// TestConntrackProbeLeavesNothing runs the init container's nft file in a fresh
// network namespace: it must load and leave no table.
func TestConntrackProbeLeavesNothing(t *testing.T) {
	testenv.RequireRoot(t, "nft")
	cm := decodeAll(t)["ConfigMap"].(*v1.ConfigMap)
	probe := cm.Data["conntrack-probe.nft"]
	if probe == "" {
		t.Fatal("no conntrack-probe.nft")
	}
	ns, err := lab.NewNS(fmt.Sprintf("%sdeploy-%d", lab.NamePrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if _, err := ns.Exec(t.Context(), probe, "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	out, err := ns.Exec(t.Context(), "", "nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "" {
		t.Errorf("tables left behind:\n%s", out)
	}
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_max"); err != nil {
		t.Errorf("nf_conntrack's sysctls: %v", err)
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
		"networking.k8s.io/servicecidrs":  {"list", "watch"},
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
	bin := buildDaemon(t)
	dir := t.TempDir()
	cm := decodeAll(t)["ConfigMap"].(*v1.ConfigMap)
	if want := []string{"config.yaml", "conntrack-probe.nft", "kubeconfig.conf"}; !slices.Equal(keys(cm.Data), want) {
		t.Fatalf("ConfigMap data keys %v, want %v", keys(cm.Data), want)
	}
	run := func(config string) string {
		t.Helper()
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		// The daemon stops at the missing kubeconfig, before it touches nftables;
		// the conntrack flags (they win over the file) keep it off the sysctls it
		// sets before that, and as root it runs in a network namespace of its own
		// all the same.
		args := []string{bin, "--config=" + path, "--hostname-override=node-a",
			"--kubeconfig=" + filepath.Join(dir, "missing-kubeconfig"),
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
			"--conntrack-udp-timeout=0", "--conntrack-udp-timeout-stream=0"}
		if os.Geteuid() == 0 {
			if unshare, err := exec.LookPath("unshare"); err == nil {
				args = append([]string{unshare, "--net"}, args...)
			}
		}
		cmd := exec.Command(args[0], args[1:]...)
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
	// The Helm chart's, from values.yaml's config.
	helmCM := decodeChart(t, kustomizeValues(t))["ConfigMap"].(*v1.ConfigMap)
	if out := run(helmCM.Data["config.yaml"]); strings.Contains(out, "nftproxy: ") || !strings.Contains(out, "API server configuration") {
		t.Fatalf("the Helm chart's configuration did not load and validate:\n%s", out)
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

// buildDaemon builds cmd/nftproxy into a directory of the test's and returns its
// path; it skips without the go command.
func buildDaemon(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build cmd/nftproxy: ", err)
	}
	bin := filepath.Join(t.TempDir(), "nftproxy")
	if out, err := exec.Command(gobin, "build", "-o", bin, "github.com/nftproxy/nftproxy/cmd/nftproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/nftproxy: %v\n%s", err, out)
	}
	return bin
}

// kubeProxyTables is a ruleset as kube-proxy's nftables mode leaves it (a few of its
// objects in each family), beside nftproxy's own table and a table of someone else's.
const kubeProxyTables = `
table ip kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips { type ipv4_addr; comment "Active ClusterIPs"; }
	map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }
	chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }
	chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }
	chain filter-input { type filter hook input priority -110; policy accept; ct state new ip daddr @cluster-ips reject; }
}
table ip6 kube-proxy {
	set cluster-ips { type ipv6_addr; }
	chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }
}
table ip nftproxy {
	chain services { }
}
table inet filter {
	chain input { type filter hook input priority 0; policy accept; }
}
`

// TestTakeoverRemovesKubeProxyTables runs the deletion that the DaemonSet's
// --cleanup-table-after-sync makes once the daemon has synced (nftproxy's cleanup aimed
// at the flag's table; e2e/cluster's migration test runs the daemon so on a node that
// ran kube-proxy), with the real binary, in a fresh network namespace holding
// kube-proxy's tables: they go, and nothing else does; run again on a clean node it
// succeeds and changes nothing.
func TestTakeoverRemovesKubeProxyTables(t *testing.T) {
	testenv.RequireRoot(t, "nft")
	ds := decodeAll(t)["DaemonSet"].(*appsv1.DaemonSet)
	table := ""
	for _, arg := range ds.Spec.Template.Spec.Containers[0].Command {
		if v, ok := strings.CutPrefix(arg, "--cleanup-table-after-sync="); ok {
			table = v
		}
	}
	if table != "kube-proxy" {
		t.Fatalf("the daemon's --cleanup-table-after-sync is %q, want kube-proxy", table)
	}
	line := "/usr/local/bin/nftproxy --cleanup --table-name=" + table
	bin := buildDaemon(t)
	ns, err := lab.NewNS(fmt.Sprintf("%stakeover-%d", lab.NamePrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if _, err := ns.Exec(t.Context(), kubeProxyTables, "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	cmd := strings.Replace(line, "/usr/local/bin/nftproxy", bin, 1)
	for range 2 {
		if out, err := ns.Exec(t.Context(), "", "/bin/sh", "-c", cmd+" 2>&1"); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		out, err := ns.Exec(t.Context(), "", "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Split(strings.TrimSpace(out), "\n")
		slices.Sort(got)
		if want := []string{"table inet filter", "table ip nftproxy"}; !slices.Equal(got, want) {
			t.Fatalf("tables after the takeover %q, want %q", got, want)
		}
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
		"apt-get install -y --no-install-recommends nftables conntrack iptables",
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

// renderKustomize runs kubectl's kustomize on this directory and decodes every object
// strictly, keyed by kind; it skips without kubectl.
func renderKustomize(t *testing.T) map[string]runtime.Object {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("no kubectl to run kustomize: ", err)
	}
	out, err := exec.Command(kubectl, "kustomize", ".").Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	return decodeStream(t, out)
}

// decodeStream decodes a multi-document YAML stream strictly, keyed by kind.
func decodeStream(t *testing.T, data []byte) map[string]runtime.Object {
	t.Helper()
	objs := map[string]runtime.Object{}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 || bytes.Equal(bytes.TrimSpace(doc), []byte("---")) {
			continue
		}
		obj, gvk, err := strictDecoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if _, dup := objs[gvk.Kind]; dup {
			t.Fatalf("a second %s", gvk.Kind)
		}
		objs[gvk.Kind] = obj
	}
	return objs
}

// TestKustomizeSetsTheImage renders the kustomization: the image of every container
// is the one kustomization.yaml names, never a floating latest.
func TestKustomizeSetsTheImage(t *testing.T) {
	objs := renderKustomize(t)
	if len(objs) != len(readKustomization(t).Resources) {
		t.Errorf("kustomize rendered %d objects, want %d", len(objs), len(readKustomization(t).Resources))
	}
	images := readKustomization(t).Images
	if len(images) != 1 || images[0].Name != "nftproxy" || images[0].NewName == "" || images[0].NewTag == "" {
		t.Fatalf("kustomization images %+v, want one for nftproxy with newName and newTag", images)
	}
	want := images[0].NewName + ":" + images[0].NewTag
	if images[0].NewTag == "latest" {
		t.Errorf("image %s: a floating tag", want)
	}
	spec := objs["DaemonSet"].(*appsv1.DaemonSet).Spec.Template.Spec
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Image != want {
			t.Errorf("container %s: image %q, want %q", c.Name, c.Image, want)
		}
	}
}

// TestReadmeLinks checks that every link of README.md to the repository's README
// names a heading it has (GitHub's anchors), and that every relative file link
// exists: the kube-proxy table links rather than copies.
func TestReadmeLinks(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	top, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{"": headingAnchors(readme), "../README.md": headingAnchors(top)}
	links := regexp.MustCompile(`\]\(([^)#]*)(#[^)]*)?\)`).FindAllStringSubmatch(string(readme), -1)
	if len(links) == 0 {
		t.Fatal("no links found")
	}
	for _, l := range links {
		file, anchor := l[1], strings.TrimPrefix(l[2], "#")
		if strings.Contains(file, "://") {
			continue
		}
		if file != "" {
			if _, err := os.Stat(file); err != nil {
				t.Errorf("link %s: %v", l[0], err)
			}
		}
		if as, ok := anchors[file]; ok && anchor != "" && !as[anchor] {
			t.Errorf("link %s: no heading #%s", l[0], anchor)
		}
	}
}

// headingAnchors returns the anchors GitHub gives the Markdown headings of doc.
func headingAnchors(doc []byte) map[string]bool {
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range title {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return anchors
}
