// Package cluster is the cluster lab: a Kubernetes cluster on one machine, made of network
// namespaces. A control-plane namespace runs the real etcd, kube-apiserver and
// kube-controller-manager (v1.37.2, built by e2e/apiserver/build.sh); node namespaces share
// one L2 segment, each with its pod CIDR, pod namespaces behind it and one proxy: the real
// nftproxy binary or the real kube-proxy. Pods are API objects whose status a node agent in
// the test process writes as the kubelet would, so the EndpointSlices come from the real
// EndpointSlice controller.
//
// Everything runs inside namespaces the lab creates and removes; nothing touches the
// machine's own network namespace. It needs root and the built binaries.
package cluster
