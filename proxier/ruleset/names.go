package ruleset

import (
	"strconv"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// PortID returns the readable identity of port p of svc that comments its map
// elements: "namespace/name/protocol/port", where port is the port's
// name, or its number when it is unnamed.
func PortID(svc *state.Service, p state.ServicePort) string {
	port := p.Name
	if port == "" {
		port = strconv.Itoa(int(p.Port))
	}
	return svc.Name.Namespace + "/" + svc.Name.Name + "/" + string(p.Protocol) + "/" + port
}

// elementComment returns id cut to the length nft accepts for a comment.
func elementComment(id string) string {
	if len(id) > knftables.CommentLengthMax {
		id = id[:knftables.CommentLengthMax]
	}
	return id
}
