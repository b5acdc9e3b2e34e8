package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Binaries are the paths of the programs the cluster runs.
type Binaries struct {
	Etcd, APIServer, ControllerManager, KubeProxy, Kubectl string
	// NftProxy is the nftproxy daemon, built from this repository (BuildNftProxy).
	NftProxy string
}

// FindBinaries locates the Kubernetes binaries built by e2e/apiserver/build.sh:
// $NFTPROXY_APISERVER_DIR, or .cache/apiserver under root (the repository). It returns why
// they cannot be used.
func FindBinaries(root string) (Binaries, error) {
	dir := os.Getenv("NFTPROXY_APISERVER_DIR")
	if dir == "" {
		dir = filepath.Join(root, ".cache", "apiserver")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{
		Etcd:              filepath.Join(dir, "etcd"),
		APIServer:         filepath.Join(dir, "kube-apiserver"),
		ControllerManager: filepath.Join(dir, "kube-controller-manager"),
		KubeProxy:         filepath.Join(dir, "kube-proxy"),
		Kubectl:           filepath.Join(dir, "kubectl"),
	}
	for _, p := range []string{b.Etcd, b.APIServer, b.ControllerManager, b.KubeProxy} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			return Binaries{}, fmt.Errorf("%s is not built (run `make apiserver`)", p)
		}
	}
	return b, nil
}

// BuildNftProxy builds cmd/nftproxy of the repository at root into dir and records it in b.
func (b *Binaries) BuildNftProxy(root, dir string) error {
	bin := filepath.Join(dir, "nftproxy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/nftproxy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/nftproxy: %w\n%s", err, out)
	}
	b.NftProxy = bin
	return nil
}
