// Package kernel is the features backend that runs scenarios on the real kernel: it
// derives an e2e/lab topology from a scenario, syncs the production ruleset into the lab's
// node with the production syncer, and sends real connections whose outcome it reports.
package kernel
