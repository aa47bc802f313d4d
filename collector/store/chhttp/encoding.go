package chhttp

import (
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/ClickHouse/ch-go/compress"
	"github.com/ClickHouse/ch-go/proto"
	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// nativeBlockSize is the uncompressed size of the blocks of a compress=1
// response; ClickHouse uses 1 MiB (max_compress_block_size).
const nativeBlockSize = 1 << 20

// requestBody wraps body per Content-Encoding (gzip, deflate, br, zstd,
// lz4) and decompress=1 (ClickHouse's own compressed blocks). The returned
// closer releases decoder state.
func requestBody(body io.Reader, contentEncoding string, nativeDecompress bool) (io.Reader, func(), error) {
	cleanup := func() {}
	var r io.Reader = body
	switch enc := strings.ToLower(strings.TrimSpace(contentEncoding)); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return nil, nil, newError(proto.ErrCannotDecompress, http.StatusBadRequest, "cannot read gzip request body: %v", err)
		}
		r = zr
	case "deflate":
		zr, err := zlib.NewReader(body)
		if err != nil {
			return nil, nil, newError(proto.ErrCannotDecompress, http.StatusBadRequest, "cannot read deflate request body: %v", err)
		}
		r = zr
	case "br":
		r = brotli.NewReader(body)
	case "zstd":
		zr, err := zstd.NewReader(body, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, newError(proto.ErrCannotDecompress, http.StatusBadRequest, "cannot read zstd request body: %v", err)
		}
		r, cleanup = zr, zr.Close
	case "lz4":
		r = lz4.NewReader(body)
	default:
		return nil, nil, newError(proto.ErrUnknownCompressionMethod, http.StatusBadRequest, "unknown Content-Encoding %q (supported: gzip, deflate, br, zstd, lz4)", enc)
	}
	if nativeDecompress {
		r = &blockReader{r: compress.NewReader(r)}
	}
	return r, cleanup, nil
}

// blockReader reads ClickHouse compressed blocks. The end of the body
// between blocks is a clean io.EOF, and errors are sticky: after a failed
// read, compress.Reader would hand out its last block again.
type blockReader struct {
	r   *compress.Reader
	err error
}

func (b *blockReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.r.Read(p)
	if err != nil {
		if !errors.Is(err, io.ErrUnexpectedEOF) && errors.Is(err, io.EOF) {
			err = io.EOF
		}
		b.err = err
	}
	return n, err
}

// responseEncoding picks the HTTP compression for a response: like
// ClickHouse, only with enable_http_compression=1 and a matching
// Accept-Encoding.
func responseEncoding(acceptEncoding string, enabled bool) string {
	if !enabled {
		return ""
	}
	for _, part := range strings.Split(acceptEncoding, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		switch name = strings.ToLower(strings.TrimSpace(name)); name {
		case "gzip", "deflate", "br", "zstd":
			return name
		}
	}
	return ""
}

// writeCompressed writes data to w encoded as enc.
func writeCompressed(w io.Writer, enc string, data []byte) error {
	var zw io.WriteCloser
	switch enc {
	case "gzip":
		zw = gzip.NewWriter(w)
	case "deflate":
		zw = zlib.NewWriter(w)
	case "br":
		zw = brotli.NewWriter(w)
	case "zstd":
		e, err := zstd.NewWriter(w, zstd.WithEncoderConcurrency(1))
		if err != nil {
			return err
		}
		zw = e
	default:
		_, err := w.Write(data)
		return err
	}
	if _, err := zw.Write(data); err != nil {
		_ = zw.Close()
		return err
	}
	return zw.Close()
}

// nativeCompressed frames data as ClickHouse compressed blocks (compress=1).
func nativeCompressed(data []byte, method string) ([]byte, error) {
	m := compress.LZ4
	if method == "ZSTD" {
		m = compress.ZSTD
	}
	cw := compress.NewWriter(compress.LevelZero, m)
	out := make([]byte, 0, len(data)/2+64)
	for len(data) > 0 {
		n := min(len(data), nativeBlockSize)
		if err := cw.Compress(data[:n]); err != nil {
			return nil, err
		}
		out = append(out, cw.Data...)
		data = data[n:]
	}
	return out, nil
}
