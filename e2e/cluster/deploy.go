package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/deploy"
)

// nftproxy runs as deploy/ configures it: its ServiceAccount, ClusterRole and
// ClusterRoleBinding applied from deploy/, a token of that ServiceAccount (as the
// DaemonSet's projected volume holds it), the ConfigMap's kubeconfig.conf pointing at the
// API server's address and its config.yaml with the lab's CIDRs, and the DaemonSet's
// command line (--config, --kubeconfig, --hostname-override, --cleanup-table-after-sync,
// --cleanup-kube-proxy-iptables).
// Only the conntrack settings differ from deploy/'s: all 0, leaving the machine's sysctls
// alone.

// deployNamespace is where deploy/ installs nftproxy.
const deployNamespace = "kube-system"

// applyDeployRBAC creates deploy/'s ServiceAccount, ClusterRole and ClusterRoleBinding.
func (c *Cluster) applyDeployRBAC(ctx context.Context) error {
	var sa v1.ServiceAccount
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	for name, obj := range map[string]any{"serviceaccount.yaml": &sa, "clusterrole.yaml": &role, "clusterrolebinding.yaml": &binding} {
		data, err := deploy.Manifests.ReadFile(name)
		if err != nil {
			return fmt.Errorf("deploy/%s: %w", name, err)
		}
		if err := yaml.UnmarshalStrict(data, obj); err != nil {
			return fmt.Errorf("deploy/%s: %w", name, err)
		}
	}
	if _, err := c.Client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, &sa, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deploy/serviceaccount.yaml: %w", err)
	}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deploy/clusterrole.yaml: %w", err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deploy/clusterrolebinding.yaml: %w", err)
	}
	return nil
}

// deployFiles writes, for node n, what the DaemonSet's pod would see: the ServiceAccount's
// token and CA (the projected volume) and the ConfigMap's kubeconfig.conf and config.yaml,
// adjusted as deploy/configmap.yaml asks (the server, the CIDRs). It returns the paths of
// the config and the kubeconfig.
func (c *Cluster) deployFiles(ctx context.Context, n *Node) (config, kubeconfig string, err error) {
	dir := filepath.Join(c.Dir, n.Spec.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	tr, err := c.Client.CoreV1().ServiceAccounts(deployNamespace).CreateToken(ctx, "nftproxy",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)}},
		metav1.CreateOptions{})
	if err != nil {
		return "", "", fmt.Errorf("node %s: token of ServiceAccount %s/nftproxy: %w", n.Spec.Name, deployNamespace, err)
	}
	var cm v1.ConfigMap
	data, err := deploy.Manifests.ReadFile("configmap.yaml")
	if err != nil {
		return "", "", err
	}
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		return "", "", fmt.Errorf("deploy/configmap.yaml: %w", err)
	}

	kc, err := clientcmd.Load([]byte(cm.Data["kubeconfig.conf"]))
	if err != nil {
		return "", "", fmt.Errorf("deploy/configmap.yaml kubeconfig.conf: %w", err)
	}
	caPath, tokenPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	for _, cl := range kc.Clusters {
		cl.Server = "https://" + c.Spec.APIServerAddr.String()
		cl.CertificateAuthority = caPath
	}
	for _, u := range kc.AuthInfos {
		u.TokenFile = tokenPath
	}
	kubeconfig = filepath.Join(dir, "kubeconfig.conf")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return "", "", err
	}

	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		return "", "", fmt.Errorf("deploy/configmap.yaml config.yaml: %w", err)
	}
	for _, key := range []string{"clusterCIDR", "serviceCIDR"} {
		if _, ok := cfg[key]; !ok {
			return "", "", fmt.Errorf("deploy/configmap.yaml config.yaml: no %s to adjust", key)
		}
	}
	cfg["clusterCIDR"] = c.Spec.ClusterCIDRs()
	cfg["serviceCIDR"] = c.Spec.ServiceCIDRs()
	// Several conntrack sysctls are global to the machine: leave them all (the command
	// line's --conntrack-* flags say so too, and win).
	cfg["conntrack"] = map[string]any{"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", "", err
	}
	config = filepath.Join(dir, "config.yaml")
	for path, b := range map[string][]byte{caPath: c.CACert, tokenPath: []byte(tr.Status.Token), config: out} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return "", "", err
		}
	}
	return config, kubeconfig, nil
}
