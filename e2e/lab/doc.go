// Package lab builds throw-away network-namespace topologies (a node, its pods, a remote node
// and an external client, joined by veths) and exchanges real TCP/UDP echo traffic across them,
// so that nftables rulesets can be exercised on the kernel without touching the host namespace.
package lab
