package kernel

import (
	"net/netip"

	"github.com/nftproxy/nftproxy/e2e/lab"
)

// responderName is the name the node's responder answers with, in place of a pod name.
// Pod names are addresses, so they never equal it.
const responderName = "node"

// startResponder answers TCP connections and UDP datagrams on the node's own addresses
// the way the pods' echo servers do ("node <source it saw>"), so that a packet delivered
// to the node without DNAT is told apart from one the node refused: it stands for
// whatever listens on a real node (sshd, the kubelet). Only the scenario's protocol and
// port pairs are served, and sockets are bound to each address rather than the wildcard,
// so that UDP answers leave from the address that was asked.
func startResponder(ns *lab.NS, addrs []netip.Addr, ports []Port) (*lab.EchoServer, error) {
	eps := make([]lab.EchoPort, len(ports))
	for i, p := range ports {
		eps[i] = lab.EchoPort{Proto: p.Proto, Port: p.Port}
	}
	return lab.StartEcho(ns, responderName, addrs, eps)
}
