package store

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/ch-go/compress"
	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/andybalholm/brotli"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/internal/defaults"
)

// ErrAnswerTooLarge is wrapped by the error of a query whose answer over
// the HTTP interface is larger than ServerConfig.MaxQueryAnswer: the
// answer is held in memory, so a runaway query (a missing LIMIT, a
// proxy's endless page) must fail instead of exhausting it.
var ErrAnswerTooLarge = errors.New("clickhouse answer too large")

const (
	// DefaultMaxQueryAnswer is the default ServerConfig.MaxQueryAnswer.
	DefaultMaxQueryAnswer = 256 << 20
	// maxInsertAnswer bounds the answer to an insert: ClickHouse answers
	// an empty body, so anything large comes from something else.
	maxInsertAnswer = 1 << 20
	// maxErrorAnswer bounds what is read of a non-200 answer (its message).
	maxErrorAnswer = 64 << 10
	// exceptionTail is how much of the end of an answer is searched for
	// an exception the server wrote after the data had started.
	exceptionTail = 64 << 10
	// minIdleConnsPerHost is the least number of idle connections kept
	// per address: the writer's inserters (DefaultInserters) plus the
	// queries of the web API and the audits, with room to spare. With the
	// net/http default of 2, every burst beyond two requests opened and
	// closed connections.
	minIdleConnsPerHost = 8
	// idleConnTimeout closes an idle connection before the server is
	// likely to (ClickHouse's keep_alive_timeout is 10 to 30 s).
	idleConnTimeout = 20 * time.Second
	// nativeCompressBlock is the uncompressed size of the ClickHouse
	// compressed blocks of an insert body (max_compress_block_size).
	nativeCompressBlock = 1 << 20
)

// httpQuerier runs queries and inserts over the HTTP interface of the
// servers of an http(s) DSN, for the output formats the driver cannot
// produce (JSONEachRow and the others the web API and the audit reports
// read) and for inserts without the driver's decoding (insertHTTP). It is
// safe for concurrent use.
//
// A DSN may list several addresses (http://h1:8123,h2:8123/db, or the
// hosts and alt_hosts parameters), as clickhouse-go parses them into
// Options.Addr. Each request tries them in the order of the DSN's
// connection_open_strategy (in_order by default: always the first one
// first, as the driver does for a new connection), and goes on to the next
// address when one cannot be reached or answers that it is unavailable (an
// error that wraps ErrUnavailable); any other answer, an exception that
// every server would raise too, ends the request. When every address
// failed the error wraps ErrUnavailable.
type httpQuerier struct {
	client   *http.Client
	urls     []string // scheme://host:port/path per address, in DSN order, no query
	strategy clickhouse.ConnOpenStrategy
	rr       atomic.Uint64 // round_robin: the next first address
	settings url.Values    // the DSN's settings, sent with every query
	user     string
	password string
	// compression of insert bodies (the DSN's compress and
	// compress_level): lz4, lz4hc and zstd as ClickHouse compressed blocks
	// with decompress=1, gzip, deflate and br as Content-Encoding, as
	// clickhouse-go does over HTTP. Both are decoded by ClickHouse and by
	// the collector's own HTTP interface (chhttp). Queries and answers are
	// not compressed.
	compression clickhouse.CompressionMethod
	level       int
	blocks      sync.Pool // *compress.Writer
	maxAnswer   int64     // of a query
}

// newHTTPQuerier returns a querier for opt, or nil when opt is not the
// HTTP protocol. maxAnswer bounds the answer of a query (<= 0:
// DefaultMaxQueryAnswer).
func newHTTPQuerier(opt *clickhouse.Options, maxAnswer int64) *httpQuerier {
	var addrs []string
	for _, a := range opt.Addr {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if opt.Protocol != clickhouse.HTTP || len(addrs) == 0 {
		return nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = opt.TLS
	if opt.HTTPProxyURL != nil {
		tr.Proxy = http.ProxyURL(opt.HTTPProxyURL)
	}
	dial := defaults.Positive(opt.DialTimeout, 30*time.Second)
	// A host that drops packets costs DialTimeout before the next one is
	// tried, not the transport's default 30 s.
	tr.DialContext = (&net.Dialer{Timeout: dial, KeepAlive: 30 * time.Second}).DialContext
	idle := max(opt.MaxIdleConns, minIdleConnsPerHost)
	tr.MaxIdleConnsPerHost = idle
	tr.MaxIdleConns = idle * len(addrs)
	tr.IdleConnTimeout = idleConnTimeout
	scheme := "http"
	if opt.TLS != nil {
		scheme = "https"
	}
	path := cmp.Or(opt.HttpUrlPath, "/")
	h := &httpQuerier{client: &http.Client{Transport: tr}, strategy: opt.ConnOpenStrategy, settings: url.Values{},
		user: opt.Auth.Username, password: opt.Auth.Password, maxAnswer: defaults.Positive(maxAnswer, DefaultMaxQueryAnswer)}
	for _, a := range addrs {
		h.urls = append(h.urls, (&url.URL{Scheme: scheme, Host: a, Path: path}).String())
	}
	for k, v := range opt.Settings {
		h.settings.Set(k, fmt.Sprint(v))
	}
	if c := opt.Compression; c != nil {
		h.compression, h.level = c.Method, c.Level
	}
	return h
}

// query runs query with output format and returns the output. Failures
// to reach the servers, 5xx answers without a ClickHouse exception and
// temporary exception codes wrap ErrUnavailable; an answer larger than the
// limit wraps ErrAnswerTooLarge.
func (h *httpQuerier) query(ctx context.Context, query, format string) ([]byte, error) {
	params := url.Values{}
	params.Set("default_format", format) // a FORMAT clause in the query wins
	return h.do(ctx, params, [][]byte{[]byte(query)}, "", h.maxAnswer)
}

// insert runs an INSERT ... FORMAT statement with data (pieces sent in
// order) as its body, as ClickHouse clients do: the statement in the query
// parameter, the rows unchanged (no decoding and re-encoding on this
// side), compressed as the DSN asks.
func (h *httpQuerier) insert(ctx context.Context, statement string, data [][]byte) error {
	params := url.Values{}
	params.Set("query", statement)
	body, encoding, err := h.compress(data)
	if err != nil {
		return fmt.Errorf("compress insert: %w", err)
	}
	if encoding == "" && body != nil {
		params.Set("decompress", "1") // ClickHouse compressed blocks
	}
	if body == nil {
		body = data
	}
	_, err = h.do(ctx, params, body, encoding, maxInsertAnswer)
	return err
}

// compress returns data compressed as the DSN asks and its
// Content-Encoding (empty for ClickHouse compressed blocks), or nil when
// it is sent as is.
func (h *httpQuerier) compress(data [][]byte) ([][]byte, string, error) {
	size := 0
	for _, p := range data {
		size += len(p)
	}
	switch h.compression {
	case clickhouse.CompressionLZ4, clickhouse.CompressionLZ4HC, clickhouse.CompressionZSTD:
		w, _ := h.blocks.Get().(*compress.Writer)
		if w == nil {
			w = compress.NewWriter(compress.Level(h.level), compress.Method(h.compression))
		}
		defer h.blocks.Put(w)
		out := make([]byte, 0, size/2+64)
		chunk := make([]byte, 0, min(size, nativeCompressBlock))
		var err error // the first, sticky
		flush := func() {
			if err == nil {
				err = w.Compress(chunk)
				out = append(out, w.Data...)
			}
			chunk = chunk[:0]
		}
		for _, p := range data {
			for len(p) > 0 {
				n := min(len(p), cap(chunk)-len(chunk))
				if chunk, p = append(chunk, p[:n]...), p[n:]; len(chunk) == cap(chunk) {
					flush()
				}
			}
		}
		if len(chunk) > 0 {
			flush()
		}
		return [][]byte{out}, "", err
	case clickhouse.CompressionGZIP, clickhouse.CompressionDeflate, clickhouse.CompressionBrotli:
		var buf bytes.Buffer
		buf.Grow(size/4 + 64)
		var zw io.WriteCloser
		var err error
		var encoding string
		switch h.compression {
		case clickhouse.CompressionGZIP:
			encoding = "gzip"
			if zw, err = gzip.NewWriterLevel(&buf, h.level); err != nil {
				zw = gzip.NewWriter(&buf)
			}
		case clickhouse.CompressionDeflate:
			encoding = "deflate" // zlib format, as ClickHouse and clickhouse-go use
			if zw, err = zlib.NewWriterLevel(&buf, h.level); err != nil {
				zw = zlib.NewWriter(&buf)
			}
		default:
			encoding = "br"
			zw = brotli.NewWriterLevel(&buf, min(max(h.level, brotli.BestSpeed), brotli.BestCompression))
		}
		for _, p := range data {
			if _, err := zw.Write(p); err != nil {
				return nil, "", err
			}
		}
		if err := zw.Close(); err != nil {
			return nil, "", err
		}
		return [][]byte{buf.Bytes()}, encoding, nil
	}
	return nil, "", nil
}

// insertHTTP inserts a RowBinary batch over the HTTP interface. A batch of
// the current flows layout is transposed into a Native block first, as for
// the embedded engine (see native.go): the server parses columns about
// twice as fast as RowBinary rows of this wide table. Other batches (other
// tables, a spooled batch of an older layout) go as RowBinary.
func (s *Server) insertHTTP(ctx context.Context, table string, columns []string, dedupToken string, rows int, data []byte) error {
	q := insertQuery(qualify(s.db, table), columns, dedupToken, "RowBinary", s.syncInserts)
	body := [][]byte{data}
	var nb *nativeBuilder
	if slices.Equal(columns, FlowColumns) {
		nb, _ = s.natives.Get().(*nativeBuilder)
		if nb == nil {
			nb = new(nativeBuilder)
		}
		block, err := nb.build(columns, flowWire, rows, data)
		if err != nil {
			return fmt.Errorf("insert into %s: %w", table, err)
		}
		q, body = insertQuery(qualify(s.db, table), flowNativeColumns, dedupToken, "Native", s.syncInserts), block
	}
	if err := s.http.insert(ctx, q, body); err != nil {
		// nb is not reused: after a failure the transport may still be
		// reading the body it points into.
		return fmt.Errorf("insert %d rows into %s: %w", rows, table, err)
	}
	if nb != nil {
		s.natives.Put(nb) // the server answered after reading the whole body
	}
	return nil
}

// insertColumns implements columnarConn: the writer's batches go over HTTP
// as the Native block they were built as, and over the native protocol as
// rows (InsertRowBinary).
func (s *Server) insertColumns(ctx context.Context, table, dedupToken string, nb *nativeBuilder) error {
	if s.http == nil {
		buf, _ := s.rows.Get().(*[]byte)
		if buf == nil {
			buf = new([]byte)
		}
		defer s.rows.Put(buf)
		var err error
		if *buf, err = nb.rowBinary((*buf)[:0], flowWire); err != nil {
			return fmt.Errorf("insert into %s: %w", table, err)
		}
		return s.InsertRowBinary(ctx, table, FlowColumns, dedupToken, nb.rows, *buf)
	}
	q := insertQuery(qualify(s.db, table), flowNativeColumns, dedupToken, "Native", s.syncInserts)
	if err := s.http.insert(ctx, q, nb.assemble(FlowColumns, flowWire)); err != nil {
		return fmt.Errorf("insert %d rows into %s: %w", nb.rows, table, err)
	}
	return nil
}

var _ columnarConn = (*Server)(nil)

// first returns the index of the address a request tries first.
func (h *httpQuerier) first() int {
	switch h.strategy {
	case clickhouse.ConnOpenRoundRobin:
		return int((h.rr.Add(1) - 1) % uint64(len(h.urls)))
	case clickhouse.ConnOpenRandom:
		return rand.IntN(len(h.urls))
	}
	return 0
}

// do posts body (pieces sent in order) with the DSN's settings and params
// to the DSN's addresses until one answers (see httpQuerier), and returns
// the answer, of at most limit bytes.
func (h *httpQuerier) do(ctx context.Context, params url.Values, body [][]byte, encoding string, limit int64) ([]byte, error) {
	for k, v := range h.settings {
		if !params.Has(k) {
			params[k] = v
		}
	}
	rawQuery := params.Encode()
	start := h.first()
	var failed []string
	for i := range h.urls {
		u := h.urls[(start+i)%len(h.urls)]
		answer, err := h.attempt(ctx, u+"?"+rawQuery, body, encoding, limit)
		if err == nil {
			return answer, nil
		}
		if len(h.urls) > 1 {
			err = fmt.Errorf("%s: %w", u, err)
		}
		if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil || i == len(h.urls)-1 {
			if len(failed) > 0 {
				err = fmt.Errorf("%w (after %s)", err, strings.Join(failed, "; "))
			}
			return nil, err
		}
		failed = append(failed, err.Error())
	}
	panic("unreachable")
}

// attempt posts body to one address.
func (h *httpQuerier) attempt(ctx context.Context, target string, body [][]byte, encoding string, limit int64) ([]byte, error) {
	size := 0
	for _, p := range body {
		size += len(p)
	}
	// A fresh reader per attempt and for GetBody: chdb.Buffers consumes
	// the slice it reads. GetBody lets the transport resend the request
	// when a kept-alive connection turns out closed before it was written.
	reader := func() io.ReadCloser {
		b := chdb.Buffers(slices.Clone(body))
		return io.NopCloser(&b)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, http.NoBody)
	if err != nil {
		return nil, err
	}
	if size > 0 {
		req.Body, req.ContentLength = reader(), int64(size)
		req.GetBody = func() (io.ReadCloser, error) { return reader(), nil }
	}
	if encoding != "" {
		req.Header.Set("Content-Encoding", encoding)
	}
	if h.user != "" {
		req.Header.Set("X-ClickHouse-User", h.user)
		req.Header.Set("X-ClickHouse-Key", h.password)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp)
	}
	answer, rerr := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if int64(len(answer)) > limit {
		answer = answer[:limit]
		rerr = fmt.Errorf("%w: more than %d bytes", ErrAnswerTooLarge, limit)
		if limit == maxInsertAnswer {
			// ClickHouse answers an insert with an empty body: this came
			// from something else, and whether the rows were stored is
			// unknown. A retry under the same dedup token is safe.
			return nil, fmt.Errorf("%w: insert answer: %w", ErrUnavailable, rerr)
		}
	}
	// A mid-stream exception often breaks the framing too (the read
	// fails): the exception is the answer, not a network failure.
	if err := streamException(resp, answer, rerr == nil); err != nil {
		return nil, err
	}
	if errors.Is(rerr, ErrAnswerTooLarge) {
		return nil, rerr
	}
	if rerr != nil {
		return nil, fmt.Errorf("%w: read answer: %w", ErrUnavailable, rerr)
	}
	return answer, nil
}

// statusError returns the error of a non-200 answer.
func statusError(resp *http.Response) error {
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorAnswer))
	msg := strings.TrimSpace(string(answer))
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	code, cerr := strconv.Atoi(resp.Header.Get(exceptionCodeHeader))
	if cerr != nil {
		err := fmt.Errorf("clickhouse http %d: %s", resp.StatusCode, msg)
		// A proxy or a server not answering as ClickHouse: 5xx, and a
		// timeout or a concurrency limit (chproxy answers 429) are
		// temporary; treated as a rejection, the batch would be dropped.
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooEarly ||
			resp.StatusCode == http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "" {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	return markTemporary(code, &Exception{Code: code, Message: msg})
}

const (
	exceptionCodeHeader = "X-ClickHouse-Exception-Code"
	exceptionTagHeader  = "X-ClickHouse-Exception-Tag"
	exceptionMarker     = "__exception__"
)

// exceptionCode matches the start of a ClickHouse exception message:
// "Code: 241. DB::Exception: …" (and "Code: 241, e.displayText() =
// DB::Exception: …" of old servers).
var exceptionCode = regexp.MustCompile(`^Code: (\d+)[.,] (?:e\.displayText\(\) = )?DB::Exception`)

// streamException returns the exception a server reported in a 200
// answer, after the status was sent, or nil. complete tells whether the
// body was read to its end (the trailer is then known). The signals, most
// reliable first:
//
//   - ClickHouse 25.11+ sends X-ClickHouse-Exception-Tag with every
//     answer, and ends a failed one with "__exception__ TAG message
//     LENGTH TAG __exception__" (lines separated by CRLF), then breaks the
//     HTTP framing. The random tag cannot occur in data by chance; with
//     the header present no other text is taken for an exception.
//   - X-ClickHouse-Exception-Code, as a header of the 200 answer (set
//     when the headers were flushed early) or as a trailer.
//   - Older servers write the exception as text after the data: a last
//     line "Code: N. DB::Exception: …" (25.1 to 25.10 precede it with a
//     line "__exception__"), or, for the JSON formats with
//     http_write_exception_in_output_format (the default before 25.11), a
//     last "exception" member `{"exception":"Code: N. …"}`.
//
// The exception code decides, as for any exception, whether the error
// wraps ErrUnavailable (markTemporary).
func streamException(resp *http.Response, body []byte, complete bool) error {
	code, _ := strconv.Atoi(resp.Header.Get(exceptionCodeHeader))
	if code == 0 && complete {
		code, _ = strconv.Atoi(resp.Trailer.Get(exceptionCodeHeader))
	}
	tail := body[max(0, len(body)-exceptionTail):]
	var msg string
	if tag := resp.Header.Get(exceptionTagHeader); tag != "" {
		msg = taggedException(tail, tag)
	} else {
		msg = textException(tail)
	}
	if msg == "" && code == 0 {
		return nil
	}
	if m := exceptionCode.FindStringSubmatch(msg); code == 0 && m != nil {
		code, _ = strconv.Atoi(m[1])
	}
	msg = cmp.Or(msg, "the server reported an exception after the answer had started")
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	return markTemporary(code, &Exception{Code: code, Message: fmt.Sprintf("clickhouse exception during the answer (code %d): %s", code, msg)})
}

// taggedException returns the message of the exception block of a
// ClickHouse 25.11+ answer with exception tag tag, or "".
func taggedException(tail []byte, tag string) string {
	for end := len(tail); end > 0; {
		i := bytes.LastIndex(tail[:end], []byte(exceptionMarker))
		if i < 0 {
			return ""
		}
		end = i
		rest := bytes.TrimLeft(tail[i+len(exceptionMarker):], "\r\n")
		after, ok := bytes.CutPrefix(rest, []byte(tag))
		if !ok || (len(after) > 0 && after[0] != '\r' && after[0] != '\n') {
			continue // the closing marker, or data
		}
		msg := after
		if j := bytes.LastIndex(msg, []byte(" "+tag)); j >= 0 {
			msg = bytes.TrimRight(msg[:j], "0123456789") // "LENGTH TAG" closes the message
		}
		if msg := strings.TrimSpace(string(msg)); msg != "" {
			return msg
		}
		return "exception (empty message)"
	}
	return ""
}

// textException returns the exception text an older server wrote at the
// end of an answer, or "".
func textException(tail []byte) string {
	t := bytes.TrimRight(tail, "\r\n\x00 ")
	// The last line is the exception (possibly after a "__exception__"
	// line); in a JSON format the "exception" member is in one of the
	// last lines, before closing braces.
	for n := 0; n < 3 && len(t) > 0; n++ {
		i := bytes.LastIndexByte(t, '\n')
		line := bytes.TrimSpace(t[i+1:])
		t = bytes.TrimRight(t[:max(i, 0)], "\r\n")
		if n == 0 && exceptionCode.Match(line) {
			return string(line)
		}
		if v, ok := bytes.CutPrefix(bytes.TrimLeft(line, "{ \t"), []byte(`"exception":`)); ok {
			v = bytes.TrimLeft(v, " \t")
			if s, err := strconv.Unquote(string(bytes.TrimRight(v, "}, \t"))); err == nil && exceptionCode.MatchString(s) {
				return s
			}
			if len(v) > 0 && v[0] == '"' && exceptionCode.Match(v[1:]) {
				return string(v[1:])
			}
		}
		if i < 0 {
			break
		}
	}
	return ""
}
