// Package features holds nftproxy's declarative feature specs: each scenario file
// states a node, a proxier config, a cluster and packets with the outcome Kubernetes
// requires for them; backends (the simulator always, the kernel as root) run them.
package features
