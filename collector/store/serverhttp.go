package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

// httpQuerier runs queries over the HTTP interface of a server reached by
// an http(s) DSN, for the output formats the driver cannot produce
// (JSONEachRow and the others the web API and the audit reports read):
// the server renders them itself, exactly as the embedded engine would.
// It is safe for concurrent use.
type httpQuerier struct {
	client         *http.Client
	url            string     // scheme://host:port/path, no query
	settings       url.Values // the DSN's settings, sent with every query
	user, password string
}

// newHTTPQuerier returns a querier for opt, or nil when opt is not the
// HTTP protocol. It queries the first address of the DSN.
func newHTTPQuerier(opt *clickhouse.Options) *httpQuerier {
	if opt.Protocol != clickhouse.HTTP || len(opt.Addr) == 0 {
		return nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = opt.TLS
	if opt.HTTPProxyURL != nil {
		tr.Proxy = http.ProxyURL(opt.HTTPProxyURL)
	}
	u := url.URL{Scheme: "http", Host: opt.Addr[0], Path: opt.HttpUrlPath}
	if opt.TLS != nil {
		u.Scheme = "https"
	}
	if u.Path == "" {
		u.Path = "/"
	}
	settings := url.Values{}
	for k, v := range opt.Settings {
		settings.Set(k, fmt.Sprint(v))
	}
	return &httpQuerier{client: &http.Client{Transport: tr}, url: u.String(), settings: settings,
		user: opt.Auth.Username, password: opt.Auth.Password}
}

// query runs query with output format and returns the output. Failures
// to reach the server, 5xx answers without a ClickHouse exception and
// temporary exception codes wrap ErrUnavailable.
func (h *httpQuerier) query(ctx context.Context, query, format string) ([]byte, error) {
	params := url.Values{}
	params.Set("default_format", format) // a FORMAT clause in the query wins
	return h.do(ctx, params, strings.NewReader(query))
}

// insert runs an INSERT ... FORMAT statement with data as its body, as
// ClickHouse clients do: the statement in the query parameter, the rows
// streamed unchanged (no decoding and re-encoding on this side).
func (h *httpQuerier) insert(ctx context.Context, statement string, data io.Reader) error {
	params := url.Values{}
	params.Set("query", statement)
	_, err := h.do(ctx, params, data)
	return err
}

// insertHTTP inserts a RowBinary batch over the HTTP interface. A batch of
// the current flows layout is transposed into a Native block first, as for
// the embedded engine (see native.go): the server parses columns about
// twice as fast as RowBinary rows of this wide table. Other batches (other
// tables, a spooled batch of an older layout) go as RowBinary.
func (s *Server) insertHTTP(ctx context.Context, table string, columns []string, dedupToken string, rows int, data []byte) error {
	q := insertQuery(qualify(s.db, table), columns, dedupToken, "RowBinary", s.syncInserts)
	var body io.Reader = bytes.NewReader(data)
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
		bufs := chdb.Buffers(block)
		q, body = insertQuery(qualify(s.db, table), flowNativeColumns, dedupToken, "Native", s.syncInserts), &bufs
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

// do posts body with the DSN's settings and params, and returns the answer.
func (h *httpQuerier) do(ctx context.Context, params url.Values, body io.Reader) ([]byte, error) {
	for k, v := range h.settings {
		if !params.Has(k) {
			params[k] = v
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"?"+params.Encode(), body)
	if err != nil {
		return nil, err
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
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%w: read answer: %w", ErrUnavailable, err)
	}
	if resp.StatusCode == http.StatusOK {
		return answer, nil
	}
	msg := strings.TrimSpace(string(answer))
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	code, cerr := strconv.Atoi(resp.Header.Get("X-ClickHouse-Exception-Code"))
	if cerr != nil {
		err := fmt.Errorf("clickhouse http %d: %s", resp.StatusCode, msg)
		// A proxy or a server not answering as ClickHouse: 5xx, and a
		// timeout or a concurrency limit (chproxy answers 429) are
		// temporary; treated as a rejection, the batch would be dropped.
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooEarly ||
			resp.StatusCode == http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "" {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, err
	}
	return nil, markTemporary(code, errors.New(msg))
}
