package packet

import (
	"errors"
	"testing"
)

// FuzzParsePacket checks that Parse never panics, that its errors are positioned, and
// that every packet it accepts is valid and survives a String/Parse round trip.
func FuzzParsePacket(f *testing.F) {
	for _, s := range []string{
		"tcp 10.0.0.5:40000 -> 172.30.0.41:80 iif eth0",
		"udp [fd00::5]:53000 -> [fd00::10]:53",
		"sctp 1.2.3.4:1 -> 5.6.7.8:2 iif veth1 oif eth0 mark 0x4000 ct established",
		"icmp 10.0.0.5 -> 10.0.0.1 ct untracked",
		"icmpv6 fd00::5 -> fd00::1",
		"icmpv6 fe80::1 -> ff02::1 type nd-router-advert",
		"icmp 1.2.3.4 -> 5.6.7.8 type 3 code 13",
		"tcp 1.2.3.4:1 -> 5.6.7.8:2 flags rst,ack",
		"tpc 1.2.3.4:1 -> 5.6.7.8:2",
		"tcp [::ffff:1.2.3.4]:1 -> [::1]:2 mark 0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse(%q): error %v is not a *ParseError", s, err)
			}
			if pe.Column < 1 || pe.Column > len(s)+1 {
				t.Fatalf("Parse(%q): column %d out of range", s, pe.Column)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("Parse(%q) = %v, which does not validate: %v", s, p, err)
		}
		again, err := Parse(p.String())
		if err != nil {
			t.Fatalf("Parse(String(%q) = %q): %v", s, p.String(), err)
		}
		if again != p {
			t.Fatalf("round trip of %q: %#v != %#v", s, again, p)
		}
	})
}
