// Package proxy holds the proxier-level end-to-end suites: the production proxier.Proxier
// programs a lab node's nftables through the real nft binary and netlink, and real TCP
// and UDP connections, kernel packet traces, churn, drift and restarts are checked against it.
package proxy
