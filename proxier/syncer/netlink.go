package syncer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// messageElements bounds the encoded elements of one NEWSETELEM message: they
// form one netlink attribute, whose length is 16 bits. An element takes at most
// elementMax bytes (its comment at most 255).
const (
	messageElements = 1<<16 - 1 - elementMax
	elementMax      = 1 << 10
)

// loadTimeout bounds the wait for the kernel's answer to an element batch when
// ctx has no deadline.
const loadTimeout = 2 * time.Minute

// batch is a run of netlink messages written into one buffer: a part of an
// nf_tables batch (see frame), or its begin or end message.
type batch struct {
	b []byte
	// names are the set or map each message is about, in order.
	names []string
	// msg is where the message being written starts.
	msg int
}

// begin starts a message of type typ with flags, about the set or map name. Its
// sequence number is set when the batch is framed (writeElements).
func (w *batch) begin(typ, flags uint16, name string) {
	w.msg = len(w.b)
	w.names = append(w.names, name)
	w.b = binary.NativeEndian.AppendUint32(w.b, 0) // length, set by end
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = binary.NativeEndian.AppendUint16(w.b, flags|unix.NLM_F_REQUEST)
	w.b = binary.NativeEndian.AppendUint32(w.b, 0) // sequence
	w.b = binary.NativeEndian.AppendUint32(w.b, 0) // port: the kernel
}

// end sets the length of the message being written.
func (w *batch) end() {
	binary.NativeEndian.PutUint32(w.b[w.msg:], uint32(len(w.b)-w.msg))
}

// control writes NFNL_MSG_BATCH_BEGIN or _END.
func (w *batch) control(typ uint16) {
	w.begin(typ, 0, "")
	w.b = append(w.b, unix.AF_UNSPEC, unix.NFNETLINK_V0)
	w.b = binary.BigEndian.AppendUint16(w.b, unix.NFNL_SUBSYS_NFTABLES)
	w.end()
}

// elements starts a NEWSETELEM or DELSETELEM message for the set or map name of
// table: the nfgenmsg header, and the table and set attributes.
func (w *batch) elements(typ uint16, family byte, table, name string) {
	flags := uint16(0)
	if typ == unix.NFT_MSG_NEWSETELEM {
		flags = unix.NLM_F_CREATE
	}
	w.begin(unix.NFNL_SUBSYS_NFTABLES<<8|typ, flags, name)
	w.b = append(w.b, family, unix.NFNETLINK_V0, 0, 0)
	w.b = appendString(w.b, unix.NFTA_SET_ELEM_LIST_TABLE, table)
	w.b = appendString(w.b, unix.NFTA_SET_ELEM_LIST_SET, name)
}

// elementOps are the element operations on one set or map in a netlink batch:
// an optional flush, then deletions, then additions.
type elementOps struct {
	c     *container
	flush bool
	// del and add are the elements deleted and added; n counts them.
	del, add iter.Seq[*knftables.Element]
	n        int
}

// fullOps returns the operations that replace the elements of the sets and maps
// conts of rs in the kernel's table with those of rs: for each, a flush, then its
// elements.
func fullOps(rs *ruleset.Ruleset, conts []*container) []elementOps {
	ops := make([]elementOps, len(conts))
	for i, c := range conts {
		ops[i] = elementOps{c: c, flush: true, add: rs.KnftElements(c.name), n: len(rs.Elements[c.name])}
	}
	return ops
}

// writeElements encodes ops for the table of rs as one nf_tables batch, which the
// kernel applies atomically, and sends it through t.
//
// This is what "nft -f" does with "flush set", "delete element" and "add element"
// commands, without nft's parser: nft 1.0.6 spent 3.0-4.5 s of user time on the
// 746k elements of 50,000 Services, and an nft process takes ~10 ms to start and
// read the kernel's state even for one element. Large batches are encoded in
// parallel, each set or map straight into a buffer of its own: google/nftables
// builds slices of attributes per element, and mdlayher/netlink copies the
// messages again into a growing buffer, which took 1.9 s and 1.1 s for the same
// 746k elements.
func writeElements(ctx context.Context, rs *ruleset.Ruleset, ops []elementOps, t Transport, lookup definitions) error {
	f, ack, _, err := frameElements(rs, ops)
	if err != nil || f == nil {
		return err
	}
	return t.send(ctx, f, ack, lookup)
}

// frameElements encodes ops for the table of rs and frames them as one nf_tables
// batch: it returns the frame (nil when ops hold no message), the sequence number
// of its last message, whose acknowledgement ends the batch, and the number of
// elements deleted and added. It is writeElements without the sending, a seam
// for the tests that decode what is sent (decode.go).
func frameElements(rs *ruleset.Ruleset, ops []elementOps) (f *frame, ack uint32, n int, err error) {
	family := byte(unix.NFPROTO_IPV4)
	if rs.Family == knftables.IPv6Family {
		family = unix.NFPROTO_IPV6
	}
	parts := make([]*batch, len(ops))
	errs := make([]error, len(ops))
	for _, op := range ops {
		n += op.n
	}
	if workers := min(runtime.GOMAXPROCS(0), len(ops)); workers > 1 && n >= parallelElements {
		var wg sync.WaitGroup
		next := make(chan int, len(ops))
		for i := range ops {
			next <- i
		}
		close(next)
		for range workers {
			wg.Go(func() {
				for i := range next {
					parts[i], errs[i] = encodeOps(family, rs.Table, &ops[i])
				}
			})
		}
		wg.Wait()
	} else {
		for i := range ops {
			parts[i], errs[i] = encodeOps(family, rs.Table, &ops[i])
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, 0, n, err
	}
	// The parts go as they are, one iovec each of one sendmsg, numbered in place.
	begin, end := &batch{}, &batch{}
	begin.control(unix.NFNL_MSG_BATCH_BEGIN)
	end.control(unix.NFNL_MSG_BATCH_END)
	f = &frame{bufs: [][]byte{begin.b}, names: []string{""}}
	binary.NativeEndian.PutUint32(begin.b[8:], 1)
	var last []byte
	for _, p := range parts {
		for i, off := 0, 0; off < len(p.b); i++ {
			l := int(binary.NativeEndian.Uint32(p.b[off:]))
			f.names = append(f.names, p.names[i])
			binary.NativeEndian.PutUint32(p.b[off+8:], uint32(len(f.names)))
			last = p.b[off : off+l]
			off += l
		}
		f.bufs = append(f.bufs, p.b)
	}
	if last == nil {
		return nil, 0, 0, nil
	}
	// The last message asks for an acknowledgement: the kernel sends it once the
	// batch is committed, after the error of any message that failed (which aborts
	// the whole batch).
	binary.NativeEndian.PutUint16(last[6:], binary.NativeEndian.Uint16(last[6:])|unix.NLM_F_ACK)
	ack = binary.NativeEndian.Uint32(last[8:])
	f.names = append(f.names, "")
	binary.NativeEndian.PutUint32(end.b[8:], uint32(len(f.names)))
	f.bufs = append(f.bufs, end.b)
	return f, ack, n, nil
}

// frame is a whole nf_tables batch: its buffers, sent as the iovecs of one
// sendmsg (the kernel reads a batch from one message), and the set or map each of
// its messages is about, by sequence number - 1.
type frame struct {
	bufs  [][]byte
	names []string
}

// parallelElements is the element count from which a batch is encoded by several
// goroutines.
const parallelElements = 10000

// encodeOps returns the messages of op: a DELSETELEM without elements (a flush),
// DELSETELEMs of the keys deleted, NEWSETELEMs of the elements added.
func encodeOps(family byte, table string, op *elementOps) (*batch, error) {
	c := op.c
	// Each message's headers take about a hundred bytes for 64 KB of elements,
	// so the elements' length and a margin of two per mille hold an uncommented batch
	// without growing it: at a million Services' elements the buffer is most of
	// the first sync's memory.
	size := op.n * c.elementLen()
	w := &batch{b: make([]byte, 0, size+size>>9+1<<10)}
	if op.flush {
		w.elements(unix.NFT_MSG_DELSETELEM, family, table, c.name)
		w.end()
	}
	for _, step := range []struct {
		typ uint16
		es  iter.Seq[*knftables.Element]
	}{{unix.NFT_MSG_DELSETELEM, op.del}, {unix.NFT_MSG_NEWSETELEM, op.add}} {
		if step.es == nil {
			continue
		}
		list := -1
		for e := range step.es {
			if list < 0 {
				w.elements(step.typ, family, table, c.name)
				w.b, list = beginNest(w.b, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
			}
			var err error
			if w.b, err = c.appendElement(w.b, e, step.typ == unix.NFT_MSG_DELSETELEM); err != nil {
				return nil, err
			}
			if len(w.b)-list > messageElements {
				w.b = endAttr(w.b, list)
				w.end()
				list = -1
			}
		}
		if list >= 0 {
			w.b = endAttr(w.b, list)
			w.end()
		}
	}
	return w, nil
}

// send sends the batch in one sendmsg on the netlink socket fd, and waits for the
// acknowledgement of message last or an error. On success the kernel has
// answered every message of the batch, so fd's receive queue is empty again.
func (f *frame) send(ctx context.Context, fd int, last uint32) error {
	size := 0
	for _, b := range f.bufs {
		size += len(b)
	}
	// The batch can be far larger than net.core.wmem_max.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size+1<<20); err != nil {
		return fmt.Errorf("netlink socket buffer of %d bytes: %w", size+1<<20, err)
	}
	if err := recvTimeout(ctx, fd); err != nil {
		return err
	}
	sent, err := unix.SendmsgBuffers(fd, f.bufs, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
	if err == nil && sent != size {
		err = fmt.Errorf("%d bytes sent", sent)
	}
	if err != nil {
		return fmt.Errorf("sending a batch of %d messages (%d bytes): %w", len(f.names), size, err)
	}
	return receive(fd, make([]byte, 1<<16), func(m syscall.NetlinkMessage) (bool, error) {
		if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
			return false, nil
		}
		if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
			return true, f.failure(m, syscall.Errno(-code))
		}
		return m.Header.Seq == last, nil
	})
}

// recvTimeout bounds each wait for the kernel's answers on fd by ctx's deadline,
// or by loadTimeout when it has none.
func recvTimeout(ctx context.Context, fd int) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(loadTimeout)
	}
	tv := unix.NsecToTimeval(max(time.Until(deadline), time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("netlink socket timeout: %w", err)
	}
	return nil
}

// receive reads the kernel's answers on fd into buf and hands each message to
// fn, until fn reports the answer complete or an error.
func receive(fd int, buf []byte, fn func(syscall.NetlinkMessage) (done bool, err error)) error {
	for {
		nr, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("waiting for the kernel's answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:nr])
		if err != nil {
			return fmt.Errorf("reading the kernel's answer: %w", err)
		}
		for _, m := range msgs {
			if done, err := fn(m); done || err != nil {
				return err
			}
		}
	}
}

// failure describes the error errno the kernel answered to a message of the
// batch: the set or map it was about, and the kernel's extended-ack text if any.
func (f *frame) failure(m syscall.NetlinkMessage, errno syscall.Errno) error {
	var what string
	if len(m.Data) >= 20 {
		if seq := binary.NativeEndian.Uint32(m.Data[12:]); seq >= 1 && int(seq) <= len(f.names) && f.names[seq-1] != "" {
			what = f.names[seq-1] + ": "
		}
	}
	err := fmt.Errorf("%s%w", what, errno)
	if m.Header.Flags&unix.NLM_F_ACK_TLVS == 0 || len(m.Data) < 20 {
		return err
	}
	// With NETLINK_CAP_ACK the error carries the header of the failed message only,
	// then the extended-ack attributes.
	for tlv := m.Data[20:]; len(tlv) >= 4; {
		l, typ := int(binary.NativeEndian.Uint16(tlv)), binary.NativeEndian.Uint16(tlv[2:])
		if l < 4 || l > len(tlv) {
			break
		}
		if typ == unix.NLMSGERR_ATTR_MSG {
			return fmt.Errorf("%w (%s)", err, strings.TrimRight(string(tlv[4:l]), "\x00"))
		}
		tlv = tlv[min((l+3)&^3, len(tlv)):]
	}
	return err
}

// appendString appends a string attribute, NUL-terminated.
func appendString(b []byte, typ uint16, s string) []byte {
	b, start := beginAttr(b, typ)
	b = append(b, s...)
	return endAttr(append(b, 0), start)
}
