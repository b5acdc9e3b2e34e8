package sim

import (
	"encoding/binary"
	"strings"

	"github.com/nftproxy/nftproxy/nftdata"
)

// fieldTypes is the type of an expression: one data type, or several for a
// concatenation. The simulator keeps a value of a concatenation as its fields'
// big-endian values back to back, without the kernel's padding, so that values
// compare with bytes.Compare field by field.
type fieldTypes []*nftdata.Type

func (ft fieldTypes) width() int {
	w := 0
	for _, t := range ft {
		w += t.Width()
	}
	return w
}

func (ft fieldTypes) String() string {
	return nftdata.Layout(ft).String()
}

// compatible reports whether values of ft can be compared with values of other: the
// same number of fields, each of the same width and kind.
func (ft fieldTypes) compatible(other fieldTypes) bool {
	if len(ft) != len(other) {
		return false
	}
	for i := range ft {
		if ft[i].Width() != other[i].Width() || ft[i].Kind() != other[i].Kind() {
			return false
		}
	}
	return true
}

// parseConst parses one literal of type t. It returns the range it denotes: lo == hi for
// a single value; a range "a-b", a prefix "addr/len" or an ifname wildcard "eth*" give
// lo < hi.
func parseConst(t *nftdata.Type, tok token) (lo, hi []byte, err error) {
	s := tok.text
	if tok.kind != tWord && tok.kind != tString {
		return nil, nil, errAt(tok, "expected a %s value, found %s", t.Name(), tok.show())
	}
	if strings.HasPrefix(s, "$") {
		return nil, nil, errAt(tok, "variables (%s) are not supported", s)
	}
	if tok.kind == tString && t.Kind() != nftdata.KindIfname {
		return nil, nil, errAt(tok, "expected a %s value, found string %s", t.Name(), tok.show())
	}
	if t.Kind() == nftdata.KindVerdict {
		return nil, nil, errAt(tok, "verdicts are not values")
	}
	if lo, hi, err = t.ParseRange(s); err != nil {
		return nil, nil, errAt(tok, "%s", err)
	}
	return lo, hi, nil
}

// formatFields renders a concatenated value field by field.
func formatFields(ft fieldTypes, b []byte) string {
	if len(ft) == 1 {
		return ft[0].Format(b)
	}
	var parts []string
	off := 0
	for _, t := range ft {
		if off+t.Width() > len(b) {
			break
		}
		parts = append(parts, t.Format(b[off:off+t.Width()]))
		off += t.Width()
	}
	return strings.Join(parts, " . ")
}

// incr returns b+1 as a new slice, and false if b is all ones.
func incr(b []byte) ([]byte, bool) {
	r := append([]byte(nil), b...)
	for i := len(r) - 1; i >= 0; i-- {
		r[i]++
		if r[i] != 0 {
			return r, true
		}
	}
	return nil, false
}

// be32 encodes v as 4 big-endian bytes.
func be32(v uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return b[:]
}
