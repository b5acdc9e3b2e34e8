package syncer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// RewriteEvery is the longest a Syncer with Generations goes without rewriting
// its whole table: kube-proxy's nftables mode syncs fully once an hour
// (proxyutil.FullSyncPeriod) and partially in between.
const RewriteEvery = time.Hour

// Generations follows the nf_tables generation of one network namespace, the
// kernel's count of committed transactions, across the Syncers that write tables
// there (WithGenerations). A full sync exists to repair what another writer did to
// the table; when the generation shows that no transaction but the Syncers' own
// committed since a Syncer last wrote its table whole, nothing else can have
// changed it, and a full sync that RequestFullSync asked for (the periodic resync)
// writes only what changed, as an incremental sync (Result.Verified). Any other
// writer's transaction in the namespace, on any table, or a generation that cannot
// be read, makes the next full sync of every Syncer rewrite its table; so does a
// failed sync, and RewriteEvery.
//
// A Syncer counts its own commits (an nft transaction, a netlink batch) and reads
// the generation after each sync, and before a full sync due: when it grew by more
// than those since the last read, a transaction of another writer came in between. A transaction that changes
// nothing (a batch that flushes empty sets) leaves the generation as it was, so a
// sync may count more commits than the generation shows; another writer's
// transaction committed during that very sync then goes unseen, and is repaired
// by the rewrite RewriteEvery brings. (kube-proxy's partial syncs repair no other
// writer's change to the rules they leave alone.)
type Generations struct {
	mu sync.Mutex
	// last is the generation read after the last sync of one of the Syncers;
	// known is false until the first.
	last  uint32
	known bool
	// intact are the Syncers whose table is as they wrote it, with when they last
	// rewrote it whole.
	intact map[*Syncer]time.Time
	// now is the clock (time.Now; tests set it).
	now func() time.Time
}

// NewGenerations returns the Generations of one network namespace, to give the
// Syncers of its tables (WithGenerations).
func NewGenerations() *Generations {
	return &Generations{intact: map[*Syncer]time.Time{}, now: time.Now}
}

// WithGenerations makes the Syncer follow the nf_tables generation with g, shared by
// the Syncers of the tables of one network namespace, so that its periodic full
// syncs write only what changed while no other writer touched the namespace. It
// takes effect with a KernelNetlink transport (WithNetlink), through which the
// generation is read; without one, every full sync rewrites the table.
func WithGenerations(g *Generations) Option {
	return func(s *Syncer) { s.gens = g }
}

// generationReader is a Transport that reads the namespace's nf_tables
// generation.
type generationReader interface {
	generation(ctx context.Context) (uint32, error)
}

// errNoTransport is why the generation cannot be read after a sync whose netlink
// batch failed, which drops the transport.
var errNoTransport = errors.New("no netlink transport")

// genSync is what a Syncer knows of the generation during one sync.
type genSync struct {
	// before is the generation read when the sync began; ok is false when there
	// was none to read.
	before uint32
	ok     bool
}

// beginSync notes the generation as a sync of s begins. Only a full sync due
// decides anything by it (Syncer.verified), so only then is it read: a generation
// other than the one read after the last sync means another writer committed
// since, and no table is known to be intact any more. An incremental sync starts
// from that last one, and endSync sees any other writer's commit in between.
func (s *Syncer) beginSync(ctx context.Context) genSync {
	s.commits = 0
	r, ok := s.transport.(generationReader)
	if s.gens == nil || !ok {
		return genSync{}
	}
	g := s.gens
	if !s.full {
		g.mu.Lock()
		last, known := g.last, g.known
		g.mu.Unlock()
		if known {
			return genSync{before: last, ok: true}
		}
	}
	gen, err := r.generation(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		clear(g.intact)
		g.known = false
		return genSync{}
	}
	if !g.known || gen != g.last {
		clear(g.intact)
	}
	return genSync{before: gen, ok: true}
}

// verified reports whether the table of s is as s last wrote it, so that a full
// sync due may write only what changed: no other writer committed since s last
// rewrote it whole, less than RewriteEvery ago.
func (s *Syncer) verified(gs genSync) bool {
	if !gs.ok {
		return false
	}
	g := s.gens
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.intact[s]
	return ok && g.now().Sub(at) < RewriteEvery
}

// endSync reads the generation after a sync of s, which committed s.commits
// transactions and, when rewrote is set, wrote its table whole; failed is set
// when the sync failed.
func (s *Syncer) endSync(ctx context.Context, gs genSync, rewrote, failed bool) {
	if !gs.ok {
		return
	}
	// A failed batch drops the transport: the generation is then unknown.
	r, ok := s.transport.(generationReader)
	var gen uint32
	err := errNoTransport
	if ok {
		gen, err = r.generation(ctx)
	}
	g := s.gens
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err != nil:
		clear(g.intact)
		g.known = false
		return
	case gen-gs.before > uint32(s.commits):
		// Another writer committed during the sync (or, for an incremental one,
		// since the last).
		clear(g.intact)
	case failed:
		delete(g.intact, s)
	case rewrote:
		g.intact[s] = g.now()
	}
	g.last, g.known = gen, true
}

// generation reads the nf_tables generation of the socket's namespace
// (NFT_MSG_GETGEN) on the socket the batches go on: closing a socket of its own
// could wait for the freeing of what the last batch deleted (see kernelSocket).
func (s *kernelSocket) generation(ctx context.Context) (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *s.fd < 0 {
		fd, err := s.open()
		if err != nil {
			return 0, err
		}
		*s.fd = fd
	}
	gen, err := readGeneration(ctx, *s.fd)
	if err != nil {
		_ = unix.Close(*s.fd)
		*s.fd = -1
		return 0, fmt.Errorf("reading the nf_tables generation: %w", err)
	}
	return gen, nil
}

// genSeq is the sequence number of generation requests; batches number their
// messages from 1 up.
const genSeq = 1 << 31

// readGeneration sends NFT_MSG_GETGEN on fd and returns the NFTA_GEN_ID of the
// answer.
func readGeneration(ctx context.Context, fd int) (uint32, error) {
	w := &batch{}
	w.begin(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN, 0, "")
	w.b = append(w.b, unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0)
	w.end()
	binary.NativeEndian.PutUint32(w.b[8:], genSeq)
	if err := recvTimeout(ctx, fd); err != nil {
		return 0, err
	}
	if err := unix.Sendto(fd, w.b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	var gen uint32
	err := receive(fd, make([]byte, 1<<12), func(m syscall.NetlinkMessage) (bool, error) {
		switch {
		case m.Header.Seq != genSeq:
			return false, nil
		case m.Header.Type == unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
					return true, syscall.Errno(-code)
				}
			}
			return false, nil
		case m.Header.Type != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN || len(m.Data) < 4:
			return true, fmt.Errorf("an answer of type %#x", m.Header.Type)
		}
		attrs, err := parseAttrs(m.Data[4:])
		if err != nil {
			return true, err
		}
		for _, a := range attrs {
			if a.typ == unix.NFTA_GEN_ID && len(a.val) == 4 {
				gen = binary.BigEndian.Uint32(a.val)
				return true, nil
			}
		}
		return true, errors.New("an answer without NFTA_GEN_ID")
	})
	return gen, err
}
