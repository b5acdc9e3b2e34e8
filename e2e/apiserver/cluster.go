package apiserver

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// Addresses of the control plane, on the loopback of the namespace it runs in.
const (
	etcdURL       = "http://127.0.0.1:2379"
	apiserverHost = "127.0.0.1:6443"
	// ServiceCIDR is the API server's --service-cluster-ip-range.
	ServiceCIDR = "172.30.0.0/16"
	adminToken  = "nftproxy-e2e-admin-token"
)

// Binaries locates the kube-apiserver and etcd binaries: $NFTPROXY_APISERVER_DIR, or
// .cache/apiserver at the repository root. It returns why they cannot be used.
func Binaries() (apiserver, etcd string, err error) {
	dir := os.Getenv("NFTPROXY_APISERVER_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", ".cache", "apiserver")
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	apiserver, etcd = filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "etcd")
	for _, p := range []string{apiserver, etcd} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			return "", "", fmt.Errorf("%s is not built (run `make apiserver`)", p)
		}
	}
	return apiserver, etcd, nil
}

// ControlPlane is etcd and kube-apiserver running in a namespace.
type ControlPlane struct {
	ns    *lab.NS
	dir   string
	procs []*Process
	// CACert is the PEM certificate the API server serves (self-signed).
	CACert []byte
	// Kubeconfig is the path of an admin kubeconfig for the API server.
	Kubeconfig string
}

// Process is a child process started in a namespace, its output going to a file.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	Log  string
	done chan struct{}
	err  error
}

// Start starts name with args inside ns; its standard output and error go to
// dir/<label>.log.
func Start(ns *lab.NS, dir, label, name string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, label+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// Forked from the namespace's locked thread, the child lives in the namespace.
	if err := ns.Do(cmd.Start); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", label, err)
	}
	p := &Process{Name: label, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited tells whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process with SIGTERM, then SIGKILL after 10s.
func (p *Process) Stop() error {
	if p == nil || p.Exited() {
		return nil
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
	return nil
}

// Tail returns the last n bytes of the process's log.
func (p *Process) Tail(n int64) string {
	f, err := os.Open(p.Log)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// StartControlPlane starts etcd and kube-apiserver on the loopback of ns, with their
// files in dir, and waits until the API server is ready.
func StartControlPlane(ctx context.Context, ns *lab.NS, dir, apiserverBin, etcdBin string) (*ControlPlane, error) {
	cp := &ControlPlane{ns: ns, dir: dir}
	certPEM, keyPEM, err := ServingCert("nftproxy-e2e-apiserver", netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		return nil, err
	}
	cp.CACert = certPEM
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"serving.crt": certPEM,
		"serving.key": keyPEM,
		"sa.key":      pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saDER}),
		"tokens.csv":  []byte(adminToken + ",admin,admin,system:masters\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	etcd, err := Start(ns, dir, "etcd", etcdBin,
		"--data-dir="+filepath.Join(dir, "etcd-data"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380", "--name=default",
		"--unsafe-no-fsync", "--quota-backend-bytes=1073741824")
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, etcd)
	apiserver, err := Start(ns, dir, "kube-apiserver", apiserverBin,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--secure-port=6443", "--advertise-address=127.0.0.1",
		"--tls-cert-file="+filepath.Join(dir, "serving.crt"),
		"--tls-private-key-file="+filepath.Join(dir, "serving.key"),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=AlwaysAllow",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range="+ServiceCIDR,
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		// As kubeadm's: node proxies (kube-proxy, nftproxy's init container) are
		// privileged.
		"--allow-privileged=true",
	)
	if err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	cp.procs = append(cp.procs, apiserver)
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(cp.kubeconfig(), cp.Kubeconfig); err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	if err := WaitReady(ctx, cp.ns, apiserverHost, adminToken, cp.CACert, apiserver, etcd); err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	return cp, nil
}

func (cp *ControlPlane) kubeconfig() clientcmdapi.Config {
	return clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"e2e": {Server: "https://" + apiserverHost, CertificateAuthorityData: cp.CACert}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"admin": {Token: adminToken}},
		Contexts:       map[string]*clientcmdapi.Context{"e2e": {Cluster: "e2e", AuthInfo: "admin"}},
		CurrentContext: "e2e",
	}
}

// RESTConfig returns an admin client configuration whose connections are made inside
// the control plane's namespace, so that the test process (outside it) reaches the API
// server's loopback address.
func (cp *ControlPlane) RESTConfig() *rest.Config {
	cfg := &rest.Config{
		Host:            "https://" + apiserverHost,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.CACert},
		QPS:             1000, Burst: 1000,
		UserAgent: "nftproxy-e2e",
	}
	cfg.Dial = cp.DialContext
	return cfg
}

// DialContext dials inside the control plane's namespace.
func (cp *ControlPlane) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return DialIn(ctx, cp.ns, network, addr)
}

// Stop stops the API server, then etcd.
func (cp *ControlPlane) Stop() error {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		_ = cp.procs[i].Stop()
	}
	cp.procs = nil
	return nil
}
