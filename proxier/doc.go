// Package proxier is the production Kubernetes service proxy: proxier/state turns
// Services, EndpointSlices and the Node into plain data, proxier/ruleset lays out the
// desired nftables ruleset, proxier/changeset keeps it up to date per changed
// Service, and proxier/syncer applies it to the kernel.
package proxier
