// Package proxier is the production Kubernetes service proxy: proxier/state turns
// Services, EndpointSlices and the Node into plain data, proxier/ruleset builds the
// desired nftables ruleset from it, and proxier/sync applies that ruleset to the kernel.
package proxier
