// Package nftdata is the one codec of nftables data types: the types a set or map
// declares (ipv4_addr, inet_proto . inet_service, ...), their values as nft prints
// them, the bytes nf_tables stores and netlink carries, and the protocol-number table.
package nftdata
