package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/dualflow/dualflow/internal/segdir"
)

// A segment file holds one batch. Layout (little endian):
//
//	offset size
//	0      4    magic "DFSB"
//	4      2    format version (1)
//	6      4    metadata length M
//	10     8    payload length P
//	18     4    CRC-32C of the payload
//	22     4    CRC-32C of bytes [0, 22) followed by the metadata
//	26     M    metadata: rows, table, dedup token, columns (uvarint-prefixed)
//	26+M   P    payload (RowBinary rows)
//
// A file is valid only if its size is exactly 26+M+P and both CRCs match, so
// a truncated write, a torn header or a flipped payload bit is detected.
const (
	magic         = "DFSB"
	formatVersion = 1
	headerSize    = 26

	// maxMetaLen bounds the metadata section: a table name, a 32-character
	// token and ~60 column names take about 1 KiB; 1 MiB leaves room for
	// wide tables while keeping a corrupt length from causing a huge read.
	maxMetaLen = 1 << 20
	// maxColumns bounds the column count read from metadata (same reason).
	maxColumns = 4096
)

// ErrCorrupt is returned (wrapped) by the segment parser when a file is not a
// valid segment: bad magic, unknown version, bad checksum, wrong size.
var ErrCorrupt = errors.New("spool: corrupt segment")

// header is the fixed part of a segment plus its decoded metadata.
type header struct {
	metaLen    uint32
	payloadLen uint64
	payloadCRC uint32
	rows       int
	table      string
	token      string
	columns    []string
}

// size returns the total file size the header announces.
func (h *header) size() int64 { return headerSize + int64(h.metaLen) + int64(h.payloadLen) }

// appendHeader appends the fixed header and the metadata of the segment for
// b to dst; the payload (b.Data) follows them in the file.
func appendHeader(dst []byte, b *Batch) []byte {
	var meta []byte
	meta = binary.AppendUvarint(meta, uint64(b.Rows))
	meta = appendString(meta, b.Table)
	meta = appendString(meta, b.Token)
	meta = binary.AppendUvarint(meta, uint64(len(b.Columns)))
	for _, c := range b.Columns {
		meta = appendString(meta, c)
	}

	start := len(dst)
	dst = append(dst, magic...)
	dst = binary.LittleEndian.AppendUint16(dst, formatVersion)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(meta)))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(b.Data)))
	dst = binary.LittleEndian.AppendUint32(dst, crc32.Checksum(b.Data, segdir.Castagnoli))
	crc := crc32.Update(crc32.Checksum(dst[start:], segdir.Castagnoli), segdir.Castagnoli, meta)
	dst = binary.LittleEndian.AppendUint32(dst, crc)
	return append(dst, meta...)
}

// parseFixed parses the fixed 26-byte header and returns the metadata length
// it announces. The metadata CRC is checked by parseMeta.
func parseFixed(b []byte) (header, error) {
	var h header
	if len(b) < headerSize {
		return h, fmt.Errorf("%w: short header (%d bytes)", ErrCorrupt, len(b))
	}
	if string(b[:4]) != magic {
		return h, fmt.Errorf("%w: bad magic %q", ErrCorrupt, b[:4])
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != formatVersion {
		return h, fmt.Errorf("%w: unsupported version %d", ErrCorrupt, v)
	}
	h.metaLen = binary.LittleEndian.Uint32(b[6:])
	h.payloadLen = binary.LittleEndian.Uint64(b[10:])
	h.payloadCRC = binary.LittleEndian.Uint32(b[18:])
	if h.metaLen > maxMetaLen {
		return h, fmt.Errorf("%w: metadata length %d", ErrCorrupt, h.metaLen)
	}
	if h.payloadLen > 1<<62 {
		return h, fmt.Errorf("%w: payload length %d", ErrCorrupt, h.payloadLen)
	}
	return h, nil
}

// parseHeader parses the fixed header and the metadata at the start of b,
// which must hold at least headerSize+metaLen bytes. It checks the header
// CRC but not the payload.
func parseHeader(b []byte) (header, error) {
	h, err := parseFixed(b)
	if err != nil {
		return h, err
	}
	end := headerSize + int(h.metaLen)
	if len(b) < end {
		return h, fmt.Errorf("%w: short metadata (%d of %d bytes)", ErrCorrupt, len(b)-headerSize, h.metaLen)
	}
	want := binary.LittleEndian.Uint32(b[22:])
	if got := crc32.Update(crc32.Checksum(b[:22], segdir.Castagnoli), segdir.Castagnoli, b[headerSize:end]); got != want {
		return h, fmt.Errorf("%w: header checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	r := reader{b: b[headerSize:end], ok: true}
	rows := r.uvarint()
	h.table = r.str()
	h.token = r.str()
	ncol := r.uvarint()
	if ncol > maxColumns {
		return h, fmt.Errorf("%w: %d columns", ErrCorrupt, ncol)
	}
	if ncol > 0 {
		h.columns = make([]string, 0, ncol)
	}
	for i := uint64(0); i < ncol && r.ok; i++ {
		h.columns = append(h.columns, r.str())
	}
	if !r.ok || len(r.b) != 0 {
		return h, fmt.Errorf("%w: malformed metadata", ErrCorrupt)
	}
	if rows > 1<<40 {
		return h, fmt.Errorf("%w: row count %d", ErrCorrupt, rows)
	}
	h.rows = int(rows)
	return h, nil
}

// decodeSegment parses a whole segment file and verifies both checksums and
// the size. The returned Batch's Data aliases b.
func decodeSegment(b []byte) (Batch, error) {
	h, err := parseHeader(b)
	if err != nil {
		return Batch{}, err
	}
	if int64(len(b)) != h.size() {
		return Batch{}, fmt.Errorf("%w: size %d, header says %d", ErrCorrupt, len(b), h.size())
	}
	data := b[headerSize+int(h.metaLen):]
	if got := crc32.Checksum(data, segdir.Castagnoli); got != h.payloadCRC {
		return Batch{}, fmt.Errorf("%w: payload checksum %08x, want %08x", ErrCorrupt, got, h.payloadCRC)
	}
	return Batch{Table: h.table, Columns: h.columns, Token: h.token, Rows: h.rows, Data: data}, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// reader decodes the uvarint-prefixed metadata; ok turns false on the first
// short or malformed value and stays false.
type reader struct {
	b   []byte
	ok  bool
	tmp [binary.MaxVarintLen64]byte
}

func (r *reader) uvarint() uint64 {
	if !r.ok {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 || n != len(binary.AppendUvarint(r.tmp[:0], v)) { // reject overlong encodings
		r.ok = false
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string {
	n := r.uvarint()
	if !r.ok || n > uint64(len(r.b)) {
		r.ok = false
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}
