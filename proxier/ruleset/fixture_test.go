package ruleset

import "github.com/nftproxy/nftproxy/proxier/state/fixture"

// baseConfig is the configuration of most goldens: the ClusterCIDR detector over
// 10.0.0.0/8 and fd01::/48, and a service range per family.
func baseConfig() Config {
	return Config{
		LocalMode:    LocalClusterCIDR,
		ClusterCIDRs: fixture.Prefixes("10.0.0.0/8", "fd01::/48"),
		ServiceCIDRs: fixture.Prefixes("172.30.0.0/16", "fd02::/112"),
	}
}
