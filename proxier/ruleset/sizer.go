package ruleset

// Sizer tells when a first build has merged enough Services to guess the final
// size of its large maps, so that they are allocated once rather than grown step
// by step through the whole build.
type Sizer struct {
	total, done, at int
}

// NewSizer returns a Sizer for a build of total Services.
func NewSizer(total int) *Sizer {
	return &Sizer{total: total, at: max(total/16, 256)}
}

// Step counts one more Service merged and reports whether it is time to resize.
func (s *Sizer) Step() bool {
	s.done++
	return s.done == s.at && s.total >= 4*s.at
}

// Estimate returns the size to give a map of n entries, or 0 to leave it alone.
func (s *Sizer) Estimate(n int) int {
	if n < 64 {
		return 0
	}
	return int(float64(n) * float64(s.total) / float64(s.done) * 1.1)
}

// Presized returns a copy of m with room for n entries.
func Presized[V any](m map[string]V, n int) map[string]V {
	out := make(map[string]V, n)
	for k, v := range m {
		out[k] = v
	}
	return out
}
