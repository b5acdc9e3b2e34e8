package sim

import (
	"fmt"
	"math/bits"
	"strconv"

	"github.com/nftproxy/nftproxy/nftdata"
)

// hashExpr is "jhash EXPR mod N [seed S] [offset K]" or "symhash mod N [offset K]".
// A jhash with its seed listed is the kernel's Jenkins hash of the key's register
// bytes, decided from the packet; without one (the kernel drew it) and symhash (the
// flow dissector's hash, seeded at boot) fork like numgen random, each value with
// probability 1/N.
type hashExpr struct {
	sym    bool
	key    expr // jhash only
	mod    uint32
	seed   uint32
	seeded bool
	offset uint32
	txt    string
}

func (e *hashExpr) typ() fieldTypes { return fieldTypes{nftdata.Integer32} }
func (e *hashExpr) String() string  { return e.txt }

func (e *hashExpr) eval(c *evalCtx, b []byte) ([]byte, bool) {
	if e.sym || !e.seeded {
		v := c.decide(Choice{Expr: e.txt, Mod: int(e.mod), Probability: 1 / float64(e.mod)})
		c.note(fmt.Sprintf("%s = %d (1 of %d: the kernel seeds the hash)", e.txt, v, e.mod))
		return append(b, be32(uint32(v)+e.offset)...), true
	}
	start := len(b)
	b, ok := e.key.eval(c, b)
	if !ok {
		return b, false
	}
	data := registerBytes(e.key.typ(), b[start:])
	h := uint32((uint64(jhash(data, e.seed)) * uint64(e.mod)) >> 32)
	return append(b[:start], be32(h+e.offset)...), true
}

// registerBytes lays a value out as nft registers hold it: one field as it is, the
// fields of a concatenation each padded with zeros to 4 bytes.
func registerBytes(ft fieldTypes, v []byte) []byte {
	if len(ft) == 1 {
		return append([]byte(nil), v...)
	}
	var out []byte
	off := 0
	for _, t := range ft {
		w := t.Width()
		out = append(out, v[off:off+w]...)
		for pad := (4 - w%4) % 4; pad > 0; pad-- {
			out = append(out, 0)
		}
		off += w
	}
	return out
}

// jhash is the kernel's jhash (include/linux/jhash.h, Bob Jenkins' lookup3) of k
// with initval, reading words little-endian as x86 does.
func jhash(k []byte, initval uint32) uint32 {
	a := 0xdeadbeef + uint32(len(k)) + initval
	b, c := a, a
	for len(k) > 12 {
		a += le32(k)
		b += le32(k[4:])
		c += le32(k[8:])
		a, b, c = jhashMix(a, b, c)
		k = k[12:]
	}
	if len(k) == 0 {
		return c
	}
	var tail [12]byte
	copy(tail[:], k)
	a += le32(tail[:])
	b += le32(tail[4:])
	c += le32(tail[8:])
	return jhashFinal(a, b, c)
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func jhashMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func jhashFinal(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

// parseHash reads what follows jhash or symhash.
func (rp *ruleParser) parseHash(kw token) (expr, error) {
	start := rp.i - 1
	e := &hashExpr{sym: kw.text == "symhash"}
	if !e.sym {
		k, err := rp.parseExpr()
		if err != nil {
			return nil, err
		}
		e.key = k
	}
	if _, err := rp.expectWord("mod"); err != nil {
		return nil, err
	}
	num := func(what string) (uint32, error) {
		t := rp.next()
		n, err := strconv.ParseUint(t.text, 0, 32)
		if err != nil || t.kind != tWord {
			return 0, errAt(t, "bad %s %s %s", kw.text, what, t.show())
		}
		return uint32(n), nil
	}
	var err error
	if e.mod, err = num("modulus"); err != nil {
		return nil, err
	}
	if e.mod == 0 {
		return nil, errAt(kw, "%s modulus 0", kw.text)
	}
	for rp.isWord(0, "seed") || rp.isWord(0, "offset") {
		w := rp.next().text
		v, err := num(w)
		if err != nil {
			return nil, err
		}
		if w == "seed" {
			e.seed, e.seeded = v, true
		} else {
			e.offset = v
		}
	}
	e.txt = rp.textFrom(start)
	return e, nil
}
