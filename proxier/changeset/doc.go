// Package changeset keeps the ruleset of proxier/ruleset up to date incrementally:
// a Builder rebuilds only the changed Services' fragments, settles who owns each
// shared object and frontend, and reports what changed as a Delta for the syncer.
package changeset
