package shard

import (
	"net/netip"

	"github.com/dualflow/dualflow/flow"
)

// FNV-1a, 64 bits (FNV's published offset basis and prime). It is a fixed
// function of the bytes, so every exporter on every node computes the same
// key for the same connection; hash/maphash could not promise that across
// processes.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// Key returns the shard key of r: a hash of the connection as the
// collector's correlator pairs it, the same for the source node's half and
// the destination node's half of one cross-node connection.
//
// The source endpoint is r.SNATAddr (with r.SNATPort when not 0) when
// r.SNATAddr is set, else r.SrcAddr/r.SrcPort: the destination node sees
// the translated source. The destination is r.DstAddr/r.DstPort (after
// DNAT). The two endpoints are put in a fixed order first, so A→B and B→A
// hash equal.
//
// Each endpoint is hashed as its family, then its 4- or 16-byte address,
// so an IPv4 tuple and an IPv6 tuple never share their hashed bytes. IPv4-mapped IPv6 addresses are unmapped first: the IPFIX encoder
// sends them as IPv4 and the collector pairs them as IPv4, so they must go
// where the plain IPv4 address goes.
//
// Key does not allocate and is safe for concurrent use.
func Key(r *flow.Record) uint64 {
	src, sport := r.SrcAddr, r.SrcPort
	if r.SNATAddr.IsValid() {
		src = r.SNATAddr
		if r.SNATPort != 0 {
			sport = r.SNATPort
		}
	}
	src, dst, dport := src.Unmap(), r.DstAddr.Unmap(), r.DstPort
	// netip's order puts IPv4 before IPv6, then compares the addresses.
	if c := src.Compare(dst); c > 0 || c == 0 && sport > dport {
		src, sport, dst, dport = dst, dport, src, sport
	}
	var buf [maxKeyLen]byte
	b := append(buf[:0], r.Proto)
	b = appendEndpoint(b, src, sport)
	b = appendEndpoint(b, dst, dport)
	h := uint64(fnvOffset64)
	for _, c := range b {
		h = (h ^ uint64(c)) * fnvPrime64
	}
	return h
}

// maxKeyLen is the most bytes hashed: the protocol and two IPv6
// endpoints.
const maxKeyLen = 1 + 2*(1+16+2)

// appendEndpoint appends one end as hashed: its family (4, 6, or 0 for
// the zero Addr), its address (4 or 16 bytes) and its port. The family
// comes first and fixes the length, so two endpoints of different
// families never give the same bytes. a must be unmapped.
func appendEndpoint(b []byte, a netip.Addr, port uint16) []byte {
	switch {
	case a.Is4():
		v := a.As4()
		b = append(append(b, 4), v[:]...)
	case a.Is6():
		v := a.As16()
		b = append(append(b, 6), v[:]...)
	default:
		b = append(b, 0)
	}
	return append(b, byte(port>>8), byte(port))
}

// mix64 is the finalizer of MurmurHash3: a bijection whose every output
// bit depends on every input bit. FNV-1a's low bits mix poorly, and the
// rendezvous weights compare whole 64-bit values.
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// nameHash is FNV-1a of a member's name, its seed in the rendezvous.
func nameHash(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime64
	}
	return mix64(h)
}

// weight is the rendezvous weight of a member (by its seed) for a key
// already through mix64.
func weight(seed, mixedKey uint64) uint64 { return mix64(seed ^ mixedKey) }
