#!/usr/bin/env bash
# build.sh DIR builds the kube-apiserver and etcd that client-go v0.37.2 pairs with into DIR
# (default .cache/apiserver), for the e2e/apiserver suite, and the kube-controller-manager,
# kube-proxy and kubectl of the same release, for the cluster lab (e2e/cluster). It is called
# by `make apiserver` and `make cluster`.
#
# kube-apiserver comes from k8s.io/kubernetes, built in a throwaway module under DIR/src:
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
# ./staging paths, which only work inside its own repository, so the throwaway go.mod replaces
# every staging module it lists with the published release of the same minor. etcd is the
# go.etcd.io/etcd/server/v3 version kubernetes itself pins. The first build takes ~15 minutes
# on 2 cores; later runs are no-ops while every binary exists. Each binary is built only when
# missing, so a cache holding the API server alone gains the others without a rebuild.
set -euo pipefail

dir=${1:-.cache/apiserver}
kube=${KUBE_VERSION:-v1.37.2}
staging=${STAGING_VERSION:-v0.37.2}
go=${GO:-go}
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off

mkdir -p "$dir/src"
dir=$(cd "$dir" && pwd)
kubecmds="kube-apiserver kube-controller-manager kube-proxy kubectl"
missing=""
for b in $kubecmds etcd; do
	[ -x "$dir/$b" ] || missing="$missing $b"
done
if [ -z "$missing" ]; then
	echo "apiserver: $kubecmds etcd are built in $dir"
	exit 0
fi
echo "apiserver: building$missing"
cd "$dir/src"

gomod=$($go mod download -json "k8s.io/kubernetes@$kube" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[ -f "$gomod" ] || { echo "apiserver: cannot find go.mod of k8s.io/kubernetes@$kube" >&2; exit 1; }
{
	echo "module nftproxy.io/apiserver-build"
	echo
	grep -m1 -E '^go [0-9.]+' "$gomod"
	echo
	echo "require k8s.io/kubernetes $kube"
	echo
	grep -oE '^[[:space:]]*k8s\.io/[A-Za-z0-9._-]+ => \./staging/src/k8s\.io/[A-Za-z0-9._-]+' "$gomod" |
		awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
} >go.mod
echo "apiserver: $(grep -c '^replace' go.mod) staging modules replaced at $staging"

start=$(date +%s)
for b in $kubecmds; do
	[ -x "$dir/$b" ] && continue
	t=$(date +%s)
	$go get "k8s.io/kubernetes/cmd/$b@$kube"
	$go build -trimpath -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube" -o "$dir/$b.tmp" "k8s.io/kubernetes/cmd/$b"
	mv "$dir/$b.tmp" "$dir/$b"
	echo "apiserver: $b built in $(($(date +%s) - t))s"
done
if [ ! -x "$dir/etcd" ]; then
	etcdv=$($go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
	$go get "go.etcd.io/etcd/server/v3@$etcdv"
	$go build -trimpath -ldflags='-s -w' -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3
	mv "$dir/etcd.tmp" "$dir/etcd"
fi
echo "apiserver: built in $(($(date +%s) - start))s into $dir"
for b in $kubecmds; do
	case $b in
	kubectl) "$dir/$b" version --client 2>/dev/null | head -1 || true ;;
	*) "$dir/$b" --version ;;
	esac
done
"$dir/etcd" --version | head -1 || true
