package sim

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/nftproxy/nftproxy/nftdata"
)

// TestSetIndexMatchesLinearScan compares the set index with a linear scan on random
// sets of exact and ranged elements over a two-field concatenation, overlaps included.
func TestSetIndexMatchesLinearScan(t *testing.T) {
	key := fieldTypes{nftdata.IPv4Addr, nftdata.InetService}
	rng := rand.New(rand.NewPCG(1, 2))
	field := func(width int, lo, hi uint64) ([]byte, []byte) {
		a, b := make([]byte, width), make([]byte, width)
		nftdata.PutUint(a, lo)
		nftdata.PutUint(b, hi)
		return a, b
	}
	for round := 0; round < 200; round++ {
		s := &setDef{name: "s", key: key, interval: true}
		n := 1 + rng.IntN(40)
		for i := 0; i < n; i++ {
			var e elemSpec
			for _, w := range []int{4, 2} {
				lo := uint64(rng.IntN(32))
				hi := lo
				if rng.IntN(3) == 0 {
					hi = lo + uint64(rng.IntN(8))
				}
				if w == 4 {
					lo, hi = 0x0a000000+lo, 0x0a000000+hi
				}
				a, b := field(w, lo, hi)
				e.lo = append(e.lo, a...)
				e.hi = append(e.hi, b...)
			}
			s.addElem(e)
		}
		s.build()
		for q := 0; q < 300; q++ {
			a, _ := field(4, 0x0a000000+uint64(rng.IntN(42)), 0)
			p, _ := field(2, uint64(rng.IntN(42)), 0)
			k := append(a, p...)
			want := int32(-1)
			isExact := func(i int32) bool { return bytes.Equal(s.lo(&s.elems[i]), s.hi(&s.elems[i])) }
			for i := range s.elems {
				lo, hi := s.lo(&s.elems[i]), s.hi(&s.elems[i])
				if bytes.Compare(lo[:4], a) <= 0 && bytes.Compare(a, hi[:4]) <= 0 &&
					bytes.Compare(lo[4:], p) <= 0 && bytes.Compare(p, hi[4:]) <= 0 {
					if want < 0 || (isExact(int32(i)) && !isExact(want)) {
						want = int32(i)
					}
				}
			}
			if got := s.idx.lookup(k); got != want {
				t.Fatalf("round %d: lookup(%s) = %d, want %d; elements:\n%v", round, formatFields(key, k), got, want, elemTexts(s))
			}
		}
	}
}

func elemTexts(s *setDef) []string {
	var out []string
	for i := range s.elems {
		out = append(out, s.elemText(int32(i)))
	}
	return out
}

func TestSetIndexWrongWidth(t *testing.T) {
	s := &setDef{key: fieldTypes{nftdata.IPv4Addr}}
	s.addElem(elemSpec{lo: []byte{1, 2, 3, 4}, hi: []byte{1, 2, 3, 4}})
	s.build()
	if s.idx.lookup([]byte{1, 2, 3}) != -1 || s.idx.lookup([]byte{1, 2, 3, 4}) != 0 {
		t.Fatal("width check")
	}
}

func TestPrefixAndRangeFormatting(t *testing.T) {
	tests := []struct {
		t    *nftdata.Type
		in   string
		want string
	}{
		{nftdata.IPv4Addr, "10.0.0.0/8", "10.0.0.0/8"},
		{nftdata.IPv4Addr, "10.1.2.3/8", "10.0.0.0/8"},
		{nftdata.IPv4Addr, "10.0.0.1-10.0.0.9", "10.0.0.1-10.0.0.9"},
		{nftdata.IPv6Addr, "fd00::/64", "fd00::/64"},
		{nftdata.InetService, "80-90", "80-90"},
		{nftdata.Ifname, "veth*", `"veth*"`},
		{nftdata.Ifname, "eth0", `"eth0"`},
		{nftdata.InetProto, "6", "tcp"},
		{nftdata.InetProto, "ipv6-icmp", "ipv6-icmp"},
		{nftdata.Mark, "16", "0x00000010"},
		{nftdata.CTState, "established", "established"},
		{nftdata.CTStatus, "48", "snat,dnat"},
	}
	for _, tt := range tests {
		lo, hi, err := parseConst(tt.t, token{kind: tWord, text: tt.in})
		if err != nil {
			t.Errorf("%s %q: %v", tt.t.Name(), tt.in, err)
			continue
		}
		if got := tt.t.FormatRange(lo, hi); got != tt.want {
			t.Errorf("%s %q formats as %q, want %q", tt.t.Name(), tt.in, got, tt.want)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "10.0.0.9-10.0.0.1", "fd00::1", "1.2.3", ""} {
		if _, _, err := parseConst(nftdata.IPv4Addr, token{kind: tWord, text: bad}); err == nil {
			t.Errorf("ipv4_addr %q parsed", bad)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]int64{"10800s": 10800, "3h": 10800, "1d2h3m4s": 93784, "90": 90, "2m30s": 150} {
		d, ok := parseDuration(in)
		if !ok || int64(d.Seconds()) != want {
			t.Errorf("parseDuration(%q) = %v %v, want %ds", in, d, ok, want)
		}
	}
	for _, bad := range []string{"", "h", "3x", "-1s"} {
		if _, ok := parseDuration(bad); ok {
			t.Errorf("parseDuration(%q) succeeded", bad)
		}
	}
}
