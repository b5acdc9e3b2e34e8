package syncer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// fieldType is an nftables data type a set or map key (or map value) field may
// have, for the types the element loader encodes itself.
type fieldType uint8

const (
	ipv4Field fieldType = iota
	ipv6Field
	protoField
	serviceField
	markField
)

// fieldTypes maps nft's data type names to fieldTypes.
var fieldTypes = map[string]fieldType{
	"ipv4_addr":    ipv4Field,
	"ipv6_addr":    ipv6Field,
	"inet_proto":   protoField,
	"inet_service": serviceField,
	"mark":         markField,
}

// protocols are the names nft gives the protocol numbers of inet_proto values.
var protocols = map[string]byte{"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58}

// layout is the encoding of the key or the value of a set or map: its fields, in
// order, and whether it is a concatenation (then each field takes a multiple of 4
// bytes, as nftables lays concatenations out in 32-bit registers).
type layout []fieldType

// parseLayout parses an nft type such as "ipv4_addr . inet_proto . inet_service".
// It fails on types the loader does not encode.
func parseLayout(typ string) (layout, error) {
	var l layout
	for _, f := range strings.Split(typ, " . ") {
		t, ok := fieldTypes[strings.TrimSpace(f)]
		if !ok {
			return nil, fmt.Errorf("type %q: field %q is not one the element loader encodes", typ, f)
		}
		l = append(l, t)
	}
	return l, nil
}

// encode appends the encoding of fields, which hold one value per field of l, to b.
// A value given as one string of fields joined with " . " is split.
func (l layout) encode(b []byte, fields []string) ([]byte, error) {
	if len(fields) == 1 && len(l) > 1 {
		fields = strings.Split(fields[0], " . ")
	}
	if len(fields) != len(l) {
		return nil, fmt.Errorf("%d fields where the type has %d", len(fields), len(l))
	}
	concat := len(l) > 1
	for i, t := range l {
		start := len(b)
		var err error
		if b, err = t.encode(b, fields[i]); err != nil {
			return nil, err
		}
		if concat {
			b = append(b, make([]byte, (4-(len(b)-start)%4)%4)...)
		}
	}
	return b, nil
}

// encode appends the network encoding of one value of type t to b.
func (t fieldType) encode(b []byte, s string) ([]byte, error) {
	switch t {
	case ipv4Field, ipv6Field:
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || (t == ipv4Field) != a.Is4() {
			return nil, fmt.Errorf("field %q: not an %s address", s, map[bool]string{true: "IPv4", false: "IPv6"}[t == ipv4Field])
		}
		if t == ipv4Field {
			a4 := a.As4()
			return append(b, a4[:]...), nil
		}
		a16 := a.As16()
		return append(b, a16[:]...), nil
	case protoField:
		if p, ok := protocols[s]; ok {
			return append(b, p), nil
		}
		n, err := strconv.ParseUint(s, 10, 8)
		if err != nil {
			return nil, fmt.Errorf("field %q: not a protocol", s)
		}
		return append(b, byte(n)), nil
	case serviceField:
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("field %q: not a port number", s)
		}
		return binary.BigEndian.AppendUint16(b, uint16(n)), nil
	case markField:
		n, err := strconv.ParseUint(s, 0, 32)
		if err != nil {
			return nil, fmt.Errorf("field %q: not a mark", s)
		}
		return binary.NativeEndian.AppendUint32(b, uint32(n)), nil
	}
	return nil, fmt.Errorf("field %q: unknown type %d", s, t)
}

// container is a set or map whose elements the loader encodes: its name and the
// layouts of its keys and values (value is nil for a set).
type container struct {
	name       string
	key, value layout
}

// containerOf returns how to encode the elements of set or m (whichever is not
// nil), or an error when the loader cannot: a set or map with the interval flag
// (whose elements are ranges), a typeof definition, or a field type it does not
// know (a verdict map's, for one). Those are left to nft.
func containerOf(set *knftables.Set, m *knftables.Map) (*container, error) {
	var name, typ string
	var flags []knftables.SetFlag
	switch {
	case set != nil:
		name, typ, flags = set.Name, set.Type, set.Flags
	case m != nil:
		name, typ, flags = m.Name, m.Type, m.Flags
	}
	for _, f := range flags {
		if f == knftables.IntervalFlag {
			return nil, fmt.Errorf("%s: interval elements are left to nft", name)
		}
	}
	if typ == "" {
		return nil, fmt.Errorf("%s: typeof definitions are left to nft", name)
	}
	c := &container{name: name}
	keyType, valueType, isMap := strings.Cut(typ, " : ")
	var err error
	if c.key, err = parseLayout(keyType); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if isMap {
		if c.value, err = parseLayout(valueType); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return c, nil
}

// appendElement appends e as one nested NFTA_LIST_ELEM attribute of a
// NEWSETELEM message: its key, its value (maps) and its comment; or, when keyOnly
// is set, of a DELSETELEM message: its key alone, which names it. An error names
// the element and the set or map.
func (c *container) appendElement(b []byte, e *knftables.Element, keyOnly bool) ([]byte, error) {
	start := len(b)
	b, err := c.encodeElement(b, e, keyOnly)
	if err == nil && len(b)-start > elementMax {
		err = fmt.Errorf("%d bytes encoded, more than %d", len(b)-start, elementMax)
	}
	if err != nil {
		return b, fmt.Errorf("element %q of %s: %w", ruleset.ElementKey(e), c.name, err)
	}
	return b, nil
}

// encodeElement is appendElement without the element in its errors.
func (c *container) encodeElement(b []byte, e *knftables.Element, keyOnly bool) ([]byte, error) {
	var err error
	b, elem := beginNest(b, unix.NFTA_LIST_ELEM)
	b, key := beginNest(b, unix.NFTA_SET_ELEM_KEY)
	b, val := beginAttr(b, unix.NFTA_DATA_VALUE)
	if b, err = c.key.encode(b, e.Key); err != nil {
		return b, fmt.Errorf("key: %w", err)
	}
	b = endAttr(endAttr(b, val), key)
	if keyOnly {
		return endAttr(b, elem), nil
	}
	if (c.value != nil) != (len(e.Value) > 0) {
		return b, errors.New("a value is needed exactly for map elements")
	}
	if c.value != nil {
		var data int
		b, data = beginNest(b, unix.NFTA_SET_ELEM_DATA)
		b, val = beginAttr(b, unix.NFTA_DATA_VALUE)
		if b, err = c.value.encode(b, e.Value); err != nil {
			return b, fmt.Errorf("value: %w", err)
		}
		b = endAttr(endAttr(b, val), data)
	}
	if e.Comment != nil {
		// nft's user data: one TLV of type NFTNL_UDATA_SET_ELEM_COMMENT (0) holding the
		// comment and its terminating NUL, its length in one byte.
		if len(*e.Comment)+1 > 255 {
			return b, fmt.Errorf("comment of %d bytes is too long", len(*e.Comment))
		}
		var ud int
		b, ud = beginAttr(b, unix.NFTA_SET_ELEM_USERDATA)
		b = append(b, 0, byte(len(*e.Comment)+1))
		b = append(b, *e.Comment...)
		b = endAttr(append(b, 0), ud)
	}
	return endAttr(b, elem), nil
}

// beginAttr appends the header of a netlink attribute of type typ, whose length
// endAttr fills in, and returns where it starts.
func beginAttr(b []byte, typ uint16) ([]byte, int) {
	start := len(b)
	b = binary.NativeEndian.AppendUint16(b, 0)
	return binary.NativeEndian.AppendUint16(b, typ), start
}

// beginNest is beginAttr for an attribute that nests others.
func beginNest(b []byte, typ uint16) ([]byte, int) {
	return beginAttr(b, typ|unix.NLA_F_NESTED)
}

// endAttr sets the length of the attribute (or nest) that starts at start and pads
// it to 4 bytes.
func endAttr(b []byte, start int) []byte {
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
