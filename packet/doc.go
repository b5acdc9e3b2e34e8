// Package packet defines Packet, the synthetic IP packet that the simulator traces
// through an nftables ruleset, and its compact text form
// (`tcp 10.0.0.5:40000 -> 172.30.0.41:80 iif eth0`), which Parse reads and String prints.
// It depends on the standard library and on nftdata, for the names of protocols.
package packet
