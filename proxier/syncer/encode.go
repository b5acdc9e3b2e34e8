package syncer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/nftdata"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// container is a set or map whose elements the loader encodes: its name and the
// layouts of its keys and values (value is nil for a set).
type container struct {
	name       string
	key, value nftdata.Layout
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
	var err error
	if c.key, c.value, err = nftdata.ParseSetType(typ); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for _, t := range append(slices.Clone(c.key), c.value...) {
		if t.Kind() == nftdata.KindVerdict || t == nftdata.IfaceIndex {
			return nil, fmt.Errorf("%s: %s fields are left to nft", name, t)
		}
	}
	return c, nil
}

// elementLen returns the bytes appendElement takes for an element of c without a
// comment: the element's nest, its key, and its value's for a map.
func (c *container) elementLen() int {
	n := 3*attrHeader + pad4(c.key.Len())
	if c.value != nil {
		n += 2*attrHeader + pad4(c.value.Len())
	}
	return n
}

// attrHeader is the length of a netlink attribute's header.
const attrHeader = 4

// pad4 rounds n up to a multiple of 4, as netlink aligns attributes.
func pad4(n int) int { return (n + 3) &^ 3 }

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
	if b, err = c.key.Encode(b, e.Key); err != nil {
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
		if b, err = c.value.Encode(b, e.Value); err != nil {
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
