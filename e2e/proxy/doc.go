// Package proxy holds the proxier-level end-to-end suites: the production state, ruleset
// and syncer code programs a lab node's nftables through the real nft binary, and real TCP
// and UDP connections, kernel packet traces, churn, drift and restarts are checked against it.
package proxy
