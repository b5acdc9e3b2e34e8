package syncer

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"
)

// Transport carries the nf_tables netlink batches in which a Syncer writes set and
// map elements (see WithNetlink): to the kernel (KernelNetlink), or into a
// knftables.Fake (FakeNetlink), so that tests and the simulator see the very
// batches the kernel is sent.
type Transport interface {
	// send delivers the batch f, whose message of sequence number ack is the last
	// one and asks for the acknowledgement, and returns the first error it met,
	// having applied none of the batch then. ops are the operations f encodes.
	send(ctx context.Context, f *frame, ack uint32, ops []elementOps) error
}

// KernelNetlink returns the Transport to the kernel's nf_tables: each batch goes in
// one sendmsg on a netlink socket opened inside do, which must run its argument in
// the network namespace of the table (nil: opened by the calling goroutine, for a
// process that stays in one namespace).
func KernelNetlink(do func(func() error) error) Transport { return kernelTransport{do} }

type kernelTransport struct{ do func(func() error) error }

func (t kernelTransport) send(ctx context.Context, f *frame, ack uint32, _ []elementOps) error {
	return f.send(ctx, ack, t.do)
}

// FakeNetlink returns a Transport into fake: each batch is applied to it as one
// transaction, atomically as the kernel applies a batch. fake must be the
// knftables.Interface the Syncer writes its nft transactions to.
func FakeNetlink(fake *knftables.Fake) Transport { return fakeTransport{fake} }

type fakeTransport struct{ fake *knftables.Fake }

func (t fakeTransport) send(ctx context.Context, _ *frame, _ uint32, ops []elementOps) error {
	tx := t.fake.NewTransaction()
	for _, op := range ops {
		c := op.c
		if op.flush {
			if set := t.fake.Table.Sets[c.name]; set != nil {
				tx.Flush(&knftables.Set{Name: c.name})
			} else {
				tx.Flush(&knftables.Map{Name: c.name})
			}
		}
		if op.del != nil {
			for e := range op.del {
				tx.Delete(e)
			}
		}
		if op.add != nil {
			for e := range op.add {
				tx.Add(e)
			}
		}
	}
	if err := t.fake.Run(ctx, tx); err != nil {
		return fmt.Errorf("applying the batch: %w", err)
	}
	return nil
}
