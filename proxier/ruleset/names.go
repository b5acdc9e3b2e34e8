package ruleset

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/state"
)

// maxNameLen is the longest table, chain or set name the kernel accepts. knftables
// calls 256 the maximum, but that count includes the terminating NUL: nft rejects a
// 256-character chain name with ERANGE.
const maxNameLen = knftables.NameLengthMax - 1

// The kinds of per-Service-port objects; a name is "<kind>-<hash>-<port id>".
const (
	kindAffinity      = "affinity"
	kindAffinityLocal = "affinity-local"
	kindAffinityEP    = "affinity-ep"
	kindFirewall      = "firewall"
)

// PortID returns the readable identity of port p of svc that names its chains and
// comments its map elements: "namespace/name/protocol/port", where port is the port's
// name, or its number when it is unnamed.
func PortID(svc *state.Service, p state.ServicePort) string {
	port := p.Name
	if port == "" {
		port = strconv.Itoa(int(p.Port))
	}
	return svc.Name.Namespace + "/" + svc.Name.Name + "/" + string(p.Protocol) + "/" + port
}

// NameHash returns the first 8 characters of base32(sha256(id)). It keeps per-Service
// names unique when the readable part must be truncated to fit the kernel's limit.
func NameHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return base32.StdEncoding.EncodeToString(sum[:])[:8]
}

// PortChainName returns the name of a per-Service-port chain or set of the given
// kind ("affinity", "firewall", ...): "<kind>-<hash>-<id>", with id cut short when
// the whole would exceed the kernel's name limit.
func PortChainName(kind, id string) string {
	return fitName(kind+"-"+NameHash(id)+"-", id, "")
}

// EndpointChainName returns the name of a per-endpoint chain or set of the given
// kind for Service port id: "<kind>-<hash>-<id>__<addr>/<port>". The endpoint part
// is never cut, because the hash only tells Service ports apart, not endpoints.
func EndpointChainName(kind, id string, ep netip.AddrPort) string {
	return fitName(kind+"-"+NameHash(id)+"-", id, "__"+nameAddr(ep.Addr())+"/"+strconv.Itoa(int(ep.Port())))
}

// fitName joins prefix, middle and suffix, truncating middle so that the result
// fits in maxNameLen.
func fitName(prefix, middle, suffix string) string {
	if room := maxNameLen - len(prefix) - len(suffix); len(middle) > room {
		middle = middle[:max(room, 0)]
	}
	return prefix + middle + suffix
}

// nameAddr spells an address as nft identifiers allow: nft rejects ':' in a name,
// so IPv6 colons become '-', a character no address contains, which keeps distinct
// addresses distinct.
func nameAddr(a netip.Addr) string {
	return strings.ReplaceAll(a.Unmap().WithZone("").String(), ":", "-")
}

// elementComment returns id cut to the length nft accepts for a comment.
func elementComment(id string) *string {
	if len(id) > knftables.CommentLengthMax {
		id = id[:knftables.CommentLengthMax]
	}
	return &id
}
