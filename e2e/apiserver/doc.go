// Package apiserver is the end-to-end suite of nftproxy against a real kube-apiserver
// and etcd (built by `make apiserver` into .cache/apiserver/). Everything runs inside a
// lab network namespace: etcd and kube-apiserver on the node namespace's loopback, the
// real nftproxy binary programming that namespace, and pods answering behind a
// ClusterIP. The suite applies deploy/'s manifests with a server-side dry run, checks
// that traffic reaches a Service's endpoint, and measures network programming latency
// (EndpointSlice written -> new connections reach the new endpoint).
//
// It needs root and the built binaries, and skips with a message otherwise. build.sh
// builds the binaries.
package apiserver
