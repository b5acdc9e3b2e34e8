package nftdata

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Layout is the type of the keys of a set or map, or of the values of a map: one
// data type, or several concatenated ("ipv4_addr . inet_proto . inet_service").
// In the kernel's encoding of a concatenation each field takes a multiple of 4
// bytes, as nf_tables lays concatenations out in 32-bit registers; a single field
// takes its own width.
type Layout []*Type

// FieldError is an error about one field of a value of a Layout.
type FieldError struct {
	// Field is the index of the field, from 0.
	Field int
	// Type is the field's data type.
	Type *Type
	// Err is what is wrong with the field's value.
	Err error
}

// Error names the field by its position (from 1) and type.
func (e *FieldError) Error() string {
	return fmt.Sprintf("field %d (%s): %v", e.Field+1, e.Type.name, e.Err)
}

// Unwrap returns the error about the field's value.
func (e *FieldError) Unwrap() error { return e.Err }

// ParseLayout parses a data type as nft prints it in a set or map declaration:
// "ipv4_addr", or a concatenation "ipv4_addr . inet_proto . inet_service".
func ParseLayout(typ string) (Layout, error) {
	var l Layout
	for i, f := range strings.Split(typ, " . ") {
		t, ok := TypeByName(strings.TrimSpace(f))
		if !ok {
			return nil, fmt.Errorf("type %q: field %d %q is not a known data type", typ, i+1, f)
		}
		l = append(l, t)
	}
	if len(l) > 1 && slices.Contains(l, VerdictType) {
		return nil, fmt.Errorf("type %q: a verdict cannot be concatenated", typ)
	}
	return l, nil
}

// ParseSetType parses the type of a set ("ipv4_addr . inet_service") or of a map
// ("ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service"), and
// returns the layouts of its keys and values (nil for a set).
func ParseSetType(typ string) (key, value Layout, err error) {
	keyType, valueType, isMap := strings.Cut(typ, " : ")
	if key, err = ParseLayout(keyType); err != nil {
		return nil, nil, err
	}
	if key[0] == VerdictType {
		return nil, nil, fmt.Errorf("type %q: a verdict is not a key", typ)
	}
	if isMap {
		if value, err = ParseLayout(valueType); err != nil {
			return nil, nil, err
		}
	}
	return key, value, nil
}

// String returns the layout as nft prints it.
func (l Layout) String() string {
	names := make([]string, len(l))
	for i, t := range l {
		names[i] = t.name
	}
	return strings.Join(names, " . ")
}

// fieldLen returns the number of bytes field t takes in the kernel's encoding of
// a value of l.
func (l Layout) fieldLen(t *Type) int {
	if len(l) == 1 {
		return t.width
	}
	return (t.width + 3) &^ 3
}

// Len returns the number of bytes of a value of l in the kernel's encoding.
func (l Layout) Len() int {
	n := 0
	for _, t := range l {
		n += l.fieldLen(t)
	}
	return n
}

// fields checks that fields holds one text per field of l, splitting a single
// text of fields joined with " . ".
func (l Layout) fields(fields []string) ([]string, error) {
	if len(fields) == 1 && len(l) > 1 {
		fields = strings.Split(fields[0], " . ")
	}
	if len(fields) != len(l) {
		return nil, fmt.Errorf("%d fields where the type %s has %d", len(fields), l, len(l))
	}
	return fields, nil
}

// Encode appends the kernel's encoding of a value of l to b: fields holds the text
// of each field as nft reads it, or one text of all fields joined with " . ".
func (l Layout) Encode(b []byte, fields []string) ([]byte, error) {
	fields, err := l.fields(fields)
	if err != nil {
		return b, err
	}
	for i, t := range l {
		v, err := t.Parse(fields[i])
		if err == nil && t.unstored {
			err = fmt.Errorf("%s values are not stored as the kernel stores them", t.name)
		}
		if err != nil {
			return b, &FieldError{Field: i, Type: t, Err: err}
		}
		b = l.appendField(b, t, v)
	}
	return b, nil
}

// EncodeRange returns the kernel's encoding of the first and last value of a range
// of l, as an interval set stores a range of concatenations (the element's key and
// key end): fields holds the text of each field, a value or a range of values
// ("10.0.0.0/8", "80-90").
func (l Layout) EncodeRange(fields []string) (lo, hi []byte, err error) {
	if fields, err = l.fields(fields); err != nil {
		return nil, nil, err
	}
	for i, t := range l {
		flo, fhi, err := t.ParseRange(fields[i])
		if err == nil && t.unstored {
			err = fmt.Errorf("%s values are not stored as the kernel stores them", t.name)
		}
		if err != nil {
			return nil, nil, &FieldError{Field: i, Type: t, Err: err}
		}
		lo, hi = l.appendField(lo, t, flo), l.appendField(hi, t, fhi)
	}
	return lo, hi, nil
}

// appendField appends field value v of type t, big-endian, in the kernel's
// encoding.
func (l Layout) appendField(b []byte, t *Type, v []byte) []byte {
	start := len(b)
	b = append(b, v...)
	if t.hostOrder {
		toHost(b[start:])
	}
	return append(b, make([]byte, l.fieldLen(t)-t.width)...)
}

// Decode returns the text of each field of b, a value of l in the kernel's
// encoding, as nft lists it.
func (l Layout) Decode(b []byte) ([]string, error) {
	vals, err := l.split(b)
	if err != nil {
		return nil, err
	}
	fields := make([]string, len(l))
	for i, t := range l {
		fields[i] = t.Format(vals[i])
	}
	return fields, nil
}

// DecodeRange returns the text of each field of the range lo to hi of l, in the
// kernel's encoding, as nft lists it: a value, a prefix or a range.
func (l Layout) DecodeRange(lo, hi []byte) ([]string, error) {
	los, err := l.split(lo)
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	his, err := l.split(hi)
	if err != nil {
		return nil, fmt.Errorf("end: %w", err)
	}
	fields := make([]string, len(l))
	for i, t := range l {
		if bytes.Compare(los[i], his[i]) > 0 {
			return nil, &FieldError{Field: i, Type: t, Err: errors.New("range ends before it starts")}
		}
		fields[i] = t.FormatRange(los[i], his[i])
	}
	return fields, nil
}

// split returns the values of the fields of b, big-endian.
func (l Layout) split(b []byte) ([][]byte, error) {
	if len(b) != l.Len() {
		return nil, fmt.Errorf("%d bytes where the type %s takes %d", len(b), l, l.Len())
	}
	vals := make([][]byte, len(l))
	for i, t := range l {
		if t.unstored {
			return nil, &FieldError{Field: i, Type: t, Err: fmt.Errorf("%s values are not stored as the kernel stores them", t.name)}
		}
		n := l.fieldLen(t)
		v, pad := slices.Clone(b[:t.width]), b[t.width:n]
		if slices.ContainsFunc(pad, func(c byte) bool { return c != 0 }) {
			return nil, &FieldError{Field: i, Type: t, Err: fmt.Errorf("padding %x is not zero", pad)}
		}
		if t.hostOrder {
			toHost(v) // its own inverse
		}
		vals[i] = v
		b = b[n:]
	}
	return vals, nil
}

// littleEndian is set when the host stores integers little-endian.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// toHost turns a big-endian integer into the host's byte order, or back.
func toHost(b []byte) {
	if littleEndian {
		slices.Reverse(b)
	}
}
