package cluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftproxy/nftproxy/e2e/apiserver"
)

// Users of the API server, one token each (--token-auth-file); authorization is RBAC.
// kube-proxy is system:kube-proxy, which the bootstrap policy binds to system:node-proxier
// as in kubeadm clusters. kube-controller-manager runs its controllers under its own
// credentials (--use-service-account-credentials=false), which the bootstrap role
// system:kube-controller-manager does not cover, so it is a master. nftproxy uses the
// token of deploy/'s ServiceAccount (deploy.go).
var users = []struct{ name, token, groups string }{
	{"admin", "lab-admin-token", "system:masters"},
	{"system:kube-controller-manager", "lab-kcm-token", "system:masters"},
	{"system:kube-proxy", "lab-kube-proxy-token", ""},
}

// tokenOf returns the token of user.
func tokenOf(user string) string {
	for _, u := range users {
		if u.name == user {
			return u.token
		}
	}
	panic("cluster: no user " + user)
}

// startControlPlane starts etcd, kube-apiserver (on c.APIServer) and
// kube-controller-manager in c.ControlPlane and waits until the API server is ready.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	dir := c.Dir
	certPEM, keyPEM, err := apiserver.ServingCert("nftproxy-cluster-lab", c.Spec.APIServerAddr.Addr(), netip.MustParseAddr("127.0.0.1"), firstIP(c.Spec.ServiceCIDR))
	if err != nil {
		return err
	}
	c.CACert = certPEM
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return err
	}
	var tokens []byte
	for _, u := range users {
		line := fmt.Sprintf("%s,%s,%s", u.token, u.name, u.name)
		if u.groups != "" {
			line += fmt.Sprintf(",%q", u.groups)
		}
		tokens = append(tokens, line+"\n"...)
	}
	files := map[string][]byte{
		"serving.crt": certPEM,
		"serving.key": keyPEM,
		"sa.key":      pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saDER}),
		"tokens.csv":  tokens,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	for _, u := range users {
		if err := c.writeKubeconfig(u.name, c.kubeconfigPath(u.name)); err != nil {
			return err
		}
	}
	c.Kubeconfig = c.kubeconfigPath("admin")

	const etcdURL = "http://127.0.0.1:2379"
	etcd, err := c.start(c.ControlPlane, "etcd", c.Bin.Etcd,
		"--data-dir="+filepath.Join(dir, "etcd-data"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380", "--name=default",
		"--unsafe-no-fsync", "--quota-backend-bytes=1073741824")
	if err != nil {
		return err
	}
	apiserverProc, err := c.start(c.ControlPlane, "kube-apiserver", c.Bin.APIServer,
		"--etcd-servers="+etcdURL,
		"--bind-address=0.0.0.0", "--secure-port="+fmt.Sprint(c.Spec.APIServerAddr.Port()),
		"--advertise-address="+c.Spec.APIServerAddr.Addr().String(),
		"--tls-cert-file="+filepath.Join(dir, "serving.crt"),
		"--tls-private-key-file="+filepath.Join(dir, "serving.key"),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range="+c.Spec.ServiceCIDRs(),
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--allow-privileged=true",
	)
	if err != nil {
		return err
	}
	if err := apiserver.WaitReady(ctx, c.ControlPlane, c.Spec.APIServerAddr.String(), tokenOf("admin"), c.CACert, apiserverProc, etcd); err != nil {
		return err
	}
	args := append([]string{
		"--kubeconfig=" + c.kubeconfigPath("system:kube-controller-manager"),
		c.Spec.controllers(),
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1", "--secure-port=10257",
		"--cert-dir=" + filepath.Join(dir, "kcm-certs"),
		"--profiling=false",
		"--v=2",
	}, c.Spec.nodeIPAMFlags()...)
	_, err = c.start(c.ControlPlane, "kube-controller-manager", c.Bin.ControllerManager, args...)
	return err
}

// kubeconfigPath is where the kubeconfig of user is written.
func (c *Cluster) kubeconfigPath(user string) string {
	if user == "admin" {
		return filepath.Join(c.Dir, "kubeconfig")
	}
	return filepath.Join(c.Dir, "kubeconfig-"+filepath.Base(user))
}

// writeKubeconfig writes a kubeconfig of user for the API server's segment address,
// which every namespace of the lab reaches.
func (c *Cluster) writeKubeconfig(user, path string) error {
	cfg := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"lab": {Server: "https://" + c.Spec.APIServerAddr.String(), CertificateAuthorityData: c.CACert}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {Token: tokenOf(user)}},
		Contexts:       map[string]*clientcmdapi.Context{"lab": {Cluster: "lab", AuthInfo: user}},
		CurrentContext: "lab",
	}
	return clientcmd.WriteToFile(cfg, path)
}

// RESTConfig returns an admin client configuration whose connections are made inside
// the control plane's namespace, so that the test process reaches the API server.
func (c *Cluster) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            "https://" + c.Spec.APIServerAddr.String(),
		BearerToken:     tokenOf("admin"),
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CACert},
		QPS:             1000, Burst: 1000,
		UserAgent: "nftproxy-cluster-lab",
		Dial:      c.DialContext,
	}
}

// DialContext dials inside the control plane's namespace.
func (c *Cluster) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return apiserver.DialIn(ctx, c.ControlPlane, network, addr)
}

// firstIP is the first address of p after its network address (the kubernetes Service's).
func firstIP(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }
