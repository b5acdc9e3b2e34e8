package changeset

import (
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/state/fixture"
)

// baseConfig is the configuration of ruleset's goldens: the ClusterCIDR detector
// over 10.0.0.0/8 and fd01::/48, and a service range per family.
func baseConfig() ruleset.Config {
	return ruleset.Config{
		LocalMode:    ruleset.LocalClusterCIDR,
		ClusterCIDRs: fixture.Prefixes("10.0.0.0/8", "fd01::/48"),
		ServiceCIDRs: fixture.Prefixes("172.30.0.0/16", "fd02::/112"),
	}
}

// dual lists both families a table of the layout may have.
var dual = []knftables.Family{knftables.IPv4Family, knftables.IPv6Family}
