// Package sim compiles an nftables ruleset (a knftables.Fake, `nft list ruleset` text
// or its JSON) and traces synthetic packets through it as netfilter would, reporting
// every step, every numgen branch with its probability, and the outcome.
//
// Compilation parses each rule once into statements over a small expression tree; sets
// and maps get a hash index on the concatenated key plus, for ranges and prefixes, a
// per-field segment tree, so lookups do not depend on the number of elements. Anything
// the simulator does not understand is a *CompileError naming table, chain, rule and
// column, never a silently skipped rule.
//
// A trace walks the hooks in order. A packet with no input interface whose source is a
// node address (Env.LocalAddrs, or loopback) is locally generated: it starts at output,
// then postrouting, and, when its destination is local, loops back through prerouting
// and input on lo. Any other packet starts at prerouting; the routing decision sends it
// to input when its (possibly DNATed) destination is a node address, else to forward
// and postrouting. At each hook the base chains of every table of the packet's family
// run by priority, with conntrack at -200 (prerouting, output; before it, ct state
// reads invalid) and the NAT step at -100 (prerouting, output) or 100 (input,
// postrouting). As in nf_nat, the nat chains of a hook run only for the first packet
// of a connection and stop after the first one that sets up a translation; later
// packets of a connection committed to a Runtime skip them and are translated by the
// conntrack entry.
//
// Rules can add, update and delete elements of sets and maps from the packet path
// ("update @m { KEY [timeout T] : DATA }") with the kernel's nft_dynset semantics: add
// inserts a missing element only; update inserts one or, when the key is there,
// refreshes its timeout (if it has one) and keeps its data. A Runtime keeps these
// elements, with their data and expiry on Env.Clock, and every later lookup in the set
// or map (matches, vmap, map in dnat or meta mark set) sees them until they expire.
// As in nft, ct proto-src and proto-dst need the rule to have established a protocol
// with ports first (meta l4proto tcp, tcp dport, ...).
//
// numgen random forks the trace: every value is explored, each branch carrying its
// probability; so does a meta random comparison (iptables-nft's statistic match),
// with the share of random numbers it accepts. What a packet cannot decide — limit
// rate, quota, ct count, xt matches and targets, socket, tproxy, osf, queue,
// link-layer headers, TCP option timestamps, meta time/cpu — is a compile error
// unless CompileOptions.Forks is set; then the
// trace follows both outcomes, each branch labelled with what it assumes
// (Branch.Assumptions) and its probability should that hold. The owner of the socket
// a node's own packet comes from (meta skuid) always forks. Header
// fields a Packet does not spell out take the values of an ordinary packet: TTL 64
// (63 once forwarded), DSCP 0, SYN for a connection's first TCP segment and ACK
// after, the TCP options Linux sends, an ICMP echo request, no payload beyond
// ping's. netdev ingress and egress chains run on their devices before prerouting
// and after postrouting; bridge tables are named in every trace as not traced.
//
// Time (set timeouts) and the choice of the branch a Runtime commits are
// inputs (Env.Clock, Env.Seed, Env.Select); nothing reads the real clock or a global
// RNG. Runtime.Load swaps in a new version of the ruleset and keeps the state the
// kernel keeps across a transaction.
package sim
