package syncer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/nftdata"
)

// This file reads back the element batches writeElements sends, as knftables
// objects, so that what goes to the kernel over netlink can be applied to a
// table in memory with an ordinary transaction and compared with what nft is given.

// ElementVerb is what an ElementOp does to its set or map.
type ElementVerb string

// The element operations of a netlink batch.
const (
	// ElementAdd adds the elements (NFT_MSG_NEWSETELEM).
	ElementAdd ElementVerb = "add"
	// ElementDelete deletes the elements with the keys given (NFT_MSG_DELSETELEM).
	ElementDelete ElementVerb = "delete"
	// ElementFlush deletes every element (NFT_MSG_DELSETELEM without elements).
	ElementFlush ElementVerb = "flush"
)

// ElementOp is one element message of an nf_tables batch, as knftables objects.
type ElementOp struct {
	Verb ElementVerb
	// Family and Table are the table the message is about.
	Family knftables.Family
	Table  string
	// Set or Map is the definition of the set or map the message is about, as the
	// lookup given to the decoder returned it.
	Set *knftables.Set
	Map *knftables.Map
	// Elements are the elements added or deleted (none for a flush), with Set or
	// Map, Key, Value and Comment in the text form the ruleset package writes;
	// deleted elements have their key only, which names them.
	Elements []*knftables.Element
}

// Queue adds op to tx: a flush of its set or map, or the addition or deletion of
// each of its elements.
func (op *ElementOp) Queue(tx *knftables.Transaction) {
	if op.Verb == ElementFlush {
		if op.Set != nil {
			tx.Flush(op.Set)
		} else {
			tx.Flush(op.Map)
		}
		return
	}
	for _, e := range op.Elements {
		if op.Verb == ElementAdd {
			tx.Add(e)
		} else {
			tx.Delete(e)
		}
	}
}

// DecodeElementBatch decodes an nf_tables batch of element messages as the syncer
// sends it: the buffers of one sendmsg, which hold NFNL_MSG_BATCH_BEGIN, element
// messages (see DecodeElementMessage) and NFNL_MSG_BATCH_END. lookup returns the
// definition of a set or map by name.
func DecodeElementBatch(bufs [][]byte, lookup func(name string) (*knftables.Set, *knftables.Map)) ([]ElementOp, error) {
	msgs, err := syscall.ParseNetlinkMessage(bytes.Join(bufs, nil))
	if err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	if len(msgs) < 2 || msgs[0].Header.Type != unix.NFNL_MSG_BATCH_BEGIN || msgs[len(msgs)-1].Header.Type != unix.NFNL_MSG_BATCH_END {
		return nil, errors.New("batch: not framed by NFNL_MSG_BATCH_BEGIN and NFNL_MSG_BATCH_END")
	}
	for _, m := range []syscall.NetlinkMessage{msgs[0], msgs[len(msgs)-1]} {
		if len(m.Data) < 4 || binary.BigEndian.Uint16(m.Data[2:]) != unix.NFNL_SUBSYS_NFTABLES {
			return nil, fmt.Errorf("batch: message %d is not about the nf_tables subsystem", m.Header.Seq)
		}
	}
	ops := make([]ElementOp, 0, len(msgs)-2)
	for _, m := range msgs[1 : len(msgs)-1] {
		op, err := decodeElementMessage(m, lookup)
		if err != nil {
			return nil, fmt.Errorf("batch message %d: %w", m.Header.Seq, err)
		}
		ops = append(ops, *op)
	}
	return ops, nil
}

// DecodeElementMessage decodes one netlink message as the syncer writes it: an
// NFT_MSG_NEWSETELEM (add) or NFT_MSG_DELSETELEM (delete; without an element list,
// flush) of elements of the set or map it names, whose definition lookup returns.
// Element keys and values are decoded by the types of that definition.
func DecodeElementMessage(msg []byte, lookup func(name string) (*knftables.Set, *knftables.Map)) (*ElementOp, error) {
	msgs, err := syscall.ParseNetlinkMessage(msg)
	if err != nil {
		return nil, err
	}
	if len(msgs) != 1 {
		return nil, fmt.Errorf("%d messages where one was expected", len(msgs))
	}
	return decodeElementMessage(msgs[0], lookup)
}

func decodeElementMessage(m syscall.NetlinkMessage, lookup func(name string) (*knftables.Set, *knftables.Map)) (*ElementOp, error) {
	op := &ElementOp{}
	switch m.Header.Type {
	case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM:
		op.Verb = ElementAdd
	case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELSETELEM:
		op.Verb = ElementDelete
	default:
		return nil, fmt.Errorf("message type %#x is not an element message of nf_tables", m.Header.Type)
	}
	if len(m.Data) < 4 {
		return nil, errors.New("no nfgenmsg header")
	}
	switch m.Data[0] {
	case unix.NFPROTO_IPV4:
		op.Family = knftables.IPv4Family
	case unix.NFPROTO_IPV6:
		op.Family = knftables.IPv6Family
	default:
		return nil, fmt.Errorf("family %d is not ip or ip6", m.Data[0])
	}
	attrs, err := parseAttrs(m.Data[4:])
	if err != nil {
		return nil, err
	}
	var name string
	var list []byte
	for _, a := range attrs {
		switch a.typ {
		case unix.NFTA_SET_ELEM_LIST_TABLE:
			op.Table = cString(a.val)
		case unix.NFTA_SET_ELEM_LIST_SET:
			name = cString(a.val)
		case unix.NFTA_SET_ELEM_LIST_ELEMENTS:
			list = a.val
		default:
			return nil, fmt.Errorf("unexpected attribute %d of an element list", a.typ)
		}
	}
	if op.Table == "" || name == "" {
		return nil, errors.New("no table or no set named")
	}
	op.Set, op.Map = lookup(name)
	if op.Set == nil && op.Map == nil {
		return nil, fmt.Errorf("no set or map %q", name)
	}
	if list == nil {
		if op.Verb == ElementAdd {
			return nil, fmt.Errorf("%s: an addition without elements", name)
		}
		op.Verb = ElementFlush
		return op, nil
	}
	if op.Elements, err = decodeElements(op, name, list); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return op, nil
}

// decodeElements decodes the NFTA_LIST_ELEM attributes of list, elements of the
// set or map name of op.
func decodeElements(op *ElementOp, name string, list []byte) ([]*knftables.Element, error) {
	typ := ""
	if op.Set != nil {
		typ = op.Set.Type
	} else {
		typ = op.Map.Type
	}
	if typ == "" {
		return nil, errors.New("typeof definitions are not decoded")
	}
	key, value, err := nftdata.ParseSetType(typ)
	if err != nil {
		return nil, err
	}
	if (value != nil) != (op.Map != nil) {
		return nil, fmt.Errorf("type %q is not that of a %s", typ, map[bool]string{true: "map", false: "set"}[op.Map != nil])
	}
	attrs, err := parseAttrs(list)
	if err != nil {
		return nil, err
	}
	es := make([]*knftables.Element, 0, len(attrs))
	for i, a := range attrs {
		if a.typ != unix.NFTA_LIST_ELEM {
			return nil, fmt.Errorf("element %d: attribute %d is not an element", i, a.typ)
		}
		e, err := decodeElement(a.val, key, value)
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		if op.Set != nil {
			e.Set = name
		} else {
			e.Map = name
		}
		es = append(es, e)
	}
	return es, nil
}

// decodeElement decodes the attributes of one NFTA_LIST_ELEM: its key, its value
// (maps) and its comment.
func decodeElement(b []byte, key, value nftdata.Layout) (*knftables.Element, error) {
	attrs, err := parseAttrs(b)
	if err != nil {
		return nil, err
	}
	e := &knftables.Element{}
	for _, a := range attrs {
		switch a.typ {
		case unix.NFTA_SET_ELEM_KEY:
			if e.Key, err = decodeData(a.val, key); err != nil {
				return nil, fmt.Errorf("key: %w", err)
			}
		case unix.NFTA_SET_ELEM_DATA:
			if value == nil {
				return nil, errors.New("a value in a set element")
			}
			if e.Value, err = decodeData(a.val, value); err != nil {
				return nil, fmt.Errorf("value: %w", err)
			}
		case unix.NFTA_SET_ELEM_USERDATA:
			if e.Comment, err = decodeComment(a.val); err != nil {
				return nil, err
			}
		default:
			// Timeouts, expirations and flags (interval ends) are never written by the
			// syncer, and knftables.Element holds none of them.
			return nil, fmt.Errorf("attribute %d is not decoded", a.typ)
		}
	}
	if e.Key == nil {
		return nil, errors.New("no key")
	}
	return e, nil
}

// decodeData decodes the NFTA_DATA_VALUE nested in b, a value of l.
func decodeData(b []byte, l nftdata.Layout) ([]string, error) {
	attrs, err := parseAttrs(b)
	if err != nil {
		return nil, err
	}
	if len(attrs) != 1 || attrs[0].typ != unix.NFTA_DATA_VALUE {
		return nil, errors.New("not one NFTA_DATA_VALUE")
	}
	return l.Decode(attrs[0].val)
}

// decodeComment returns the comment in nft's user data of an element: the TLV of
// type NFTNL_UDATA_SET_ELEM_COMMENT (0), NUL-terminated; nil when there is none.
func decodeComment(ud []byte) (*string, error) {
	for len(ud) > 0 {
		if len(ud) < 2 || int(ud[1]) > len(ud)-2 {
			return nil, fmt.Errorf("user data %x is truncated", ud)
		}
		typ, val := ud[0], ud[2:2+int(ud[1])]
		if typ == 0 {
			s := cString(val)
			return &s, nil
		}
		ud = ud[2+len(val):]
	}
	return nil, nil
}

// attr is one netlink attribute: its type, without the nested and byte-order
// flags, and its value.
type attr struct {
	typ uint16
	val []byte
}

// parseAttrs splits b into netlink attributes. (vishvananda/netlink's
// nl.ParseRouteAttr would slice past an unpadded last attribute.)
func parseAttrs(b []byte) ([]attr, error) {
	var attrs []attr
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, fmt.Errorf("%d bytes left after the attributes", len(b))
		}
		l := int(binary.NativeEndian.Uint16(b))
		if l < 4 || l > len(b) {
			return nil, fmt.Errorf("attribute of length %d in %d bytes", l, len(b))
		}
		attrs = append(attrs, attr{typ: binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER), val: b[4:l]})
		b = b[min((l+3)&^3, len(b)):]
	}
	return attrs, nil
}

// cString returns the text of a NUL-terminated string attribute.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
