package syncer

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// Transport carries the nf_tables netlink batches in which a Syncer writes set and
// map elements (see WithNetlink): to the kernel (KernelNetlink), or, decoded back
// into operations, through a knftables.Interface (DecodedNetlink), so that an
// in-memory table and the simulator reading it receive the very batches the
// kernel is sent.
type Transport interface {
	// send delivers the batch f, whose message of sequence number ack is the last
	// one and asks for the acknowledgement, and returns the first error it met,
	// having applied none of the batch then. lookup returns the definition of a set
	// or map the batch names.
	send(ctx context.Context, f *frame, ack uint32, lookup definitions) error
}

// definitions returns the definition of the set or map name (one of the two is
// not nil), or two nils when there is no such set or map.
type definitions func(name string) (*knftables.Set, *knftables.Map)

// definitionsOf returns the definitions of the sets and maps of rs.
func definitionsOf(rs *ruleset.Ruleset) definitions {
	return func(name string) (*knftables.Set, *knftables.Map) { return rs.Sets[name], rs.Maps[name] }
}

// KernelNetlink returns the Transport to the kernel's nf_tables: each batch goes in
// one sendmsg on a netlink socket opened inside do, which must run its argument in
// the network namespace of the table (nil: opened by the calling goroutine, for a
// process that stays in one namespace).
//
// The socket stays open from one batch to the next (see kernelSocket for why);
// it is closed after a failed batch, by Syncer.Close, or once the Transport is
// garbage.
func KernelNetlink(do func(func() error) error) Transport {
	if do == nil {
		do = func(f func() error) error { return f() }
	}
	return &kernelTransport{sock: newKernelSocket(do)}
}

type kernelTransport struct{ sock *kernelSocket }

func (t *kernelTransport) send(ctx context.Context, f *frame, ack uint32, _ definitions) error {
	return t.sock.send(ctx, f, ack)
}

func (t *kernelTransport) generation(ctx context.Context) (uint32, error) {
	return t.sock.generation(ctx)
}

// Close closes the socket; a later batch opens another.
func (t *kernelTransport) Close() error { return t.sock.close() }

// DecodedNetlink returns a Transport that decodes each batch back into element
// operations (DecodeElementBatch) and runs them on nft as one transaction,
// atomically as the kernel applies a batch. With an in-memory knftables
// implementation, the table then holds what the kernel would after the batch,
// decoded from the bytes the kernel would get. nft must be the
// knftables.Interface the Syncer writes its nft transactions to.
func DecodedNetlink(nft knftables.Interface) Transport { return decodedTransport{nft} }

type decodedTransport struct{ nft knftables.Interface }

func (t decodedTransport) send(ctx context.Context, f *frame, _ uint32, lookup definitions) error {
	ops, err := DecodeElementBatch(f.bufs, lookup)
	if err != nil {
		return fmt.Errorf("decoding the batch: %w", err)
	}
	tx := t.nft.NewTransaction()
	for i := range ops {
		ops[i].Queue(tx)
	}
	if err := t.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("applying the decoded batch: %w", err)
	}
	return nil
}
