package chhttp

import (
	"cmp"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/ClickHouse/ch-go/proto"
)

// request is what the ClickHouse HTTP interface takes from the URL and the
// headers; the body is read separately.
type request struct {
	query    string // the "query" parameter; the body follows it
	format   string // default output format
	database string
	queryID  string
	params   map[string]string // param_<name> → server-side {name:Type}
	settings map[string]string // everything else: engine settings

	protocolVersion  uint64 // client_protocol_version: Native output revision
	httpCompression  bool   // enable_http_compression=1
	nativeCompress   bool   // compress=1: ClickHouse-compressed response
	nativeDecompress bool   // decompress=1: ClickHouse-compressed request body
	nativeMethod     string // network_compression_method (LZ4, ZSTD)
}

// httpParams are URL parameters the HTTP layer consumes instead of passing
// them to the engine as settings. Sessions, users and quotas are accepted
// and ignored: the endpoint is loopback-only and sessionless.
var httpParams = map[string]bool{
	"query": true, "database": true, "default_format": true, "query_id": true,
	"session_id": true, "session_timeout": true, "session_check": true,
	"user": true, "password": true, "quota_key": true, "role": true,
	"compress": true, "decompress": true, "client_protocol_version": true,
	"buffer_size": true, "wait_end_of_query": true, "http_wait_end_of_query": true,
	"enable_http_compression": true, "http_zlib_compression_level": true,
	"send_progress_in_http_headers": true, "http_headers_progress_interval_ms": true,
	"network_compression_method": true, "network_zstd_compression_level": true,
	"cancel_http_readonly_queries_on_client_close": true, "http_response_buffer_size": true,
	"http_native_compression_disable_checksumming_on_decompress": true,
	"stacktrace": true,
}

// maxParams caps URL parameters per request; real clients send a handful.
const maxParams = 1000

// parseRequest reads the ClickHouse HTTP interface's URL parameters and
// headers. It validates only what the HTTP layer itself uses; the engine
// judges settings and parameters.
func parseRequest(method string, u *url.URL, h http.Header) (*request, error) {
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodHead:
	default:
		return nil, newError(proto.ErrUnsupportedMethod, http.StatusMethodNotAllowed, "HTTP method %s is not supported; use GET or POST", method)
	}
	if ct := h.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil && strings.HasPrefix(mt, "multipart/") {
			return nil, newError(proto.ErrNotImplemented, http.StatusNotImplemented, "external tables (multipart/form-data requests) are not supported by the embedded store")
		}
	}
	values, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, newError(proto.ErrBadArguments, http.StatusBadRequest, "cannot parse URL parameters: %v", err)
	}
	if len(values) > maxParams {
		return nil, newError(proto.ErrBadArguments, http.StatusBadRequest, "too many URL parameters (%d, limit %d)", len(values), maxParams)
	}
	r := &request{
		query:    values.Get("query"),
		format:   cmp.Or(values.Get("default_format"), h.Get("X-ClickHouse-Format"), "TabSeparated"),
		database: cmp.Or(values.Get("database"), h.Get("X-ClickHouse-Database")),
		queryID:  values.Get("query_id"),
		params:   map[string]string{},
		settings: map[string]string{},
	}
	if v := values.Get("client_protocol_version"); v != "" {
		if r.protocolVersion, err = strconv.ParseUint(v, 10, 64); err != nil {
			return nil, newError(proto.ErrBadArguments, http.StatusBadRequest, "client_protocol_version: %q is not a number", v)
		}
	}
	r.httpCompression = boolParam(values.Get("enable_http_compression"))
	r.nativeCompress = boolParam(values.Get("compress"))
	r.nativeDecompress = boolParam(values.Get("decompress"))
	r.nativeMethod = cmp.Or(strings.ToUpper(values.Get("network_compression_method")), "LZ4")
	if r.nativeMethod != "LZ4" && r.nativeMethod != "ZSTD" {
		return nil, newError(proto.ErrUnknownCompressionMethod, http.StatusBadRequest, "unknown network_compression_method %q (LZ4 or ZSTD)", r.nativeMethod)
	}
	for name, vs := range values {
		v := vs[len(vs)-1]
		switch {
		case strings.HasPrefix(name, "param_"):
			if name == "param_" {
				return nil, newError(proto.ErrBadArguments, http.StatusBadRequest, "empty query parameter name")
			}
			r.params[strings.TrimPrefix(name, "param_")] = v
		case httpParams[name]:
		case strings.HasSuffix(name, "_structure") || strings.HasSuffix(name, "_types"):
			return nil, newError(proto.ErrNotImplemented, http.StatusNotImplemented, "external tables (%s) are not supported by the embedded store", name)
		default:
			r.settings[name] = v
		}
	}
	if ro, ok := r.settings["readonly"]; ok {
		if _, err := strconv.ParseUint(ro, 10, 8); err != nil {
			return nil, newError(proto.ErrBadArguments, http.StatusBadRequest, "readonly: %q is not 0, 1 or 2", ro)
		}
	}
	// Like ClickHouse: GET requests may only read.
	if method != http.MethodPost && r.settings["readonly"] != "1" {
		r.settings["readonly"] = "2"
	}
	return r, nil
}

func boolParam(v string) bool {
	switch strings.ToLower(v) {
	case "1", "true":
		return true
	}
	return false
}

// statusError is an error raised by the HTTP layer itself, rendered like a
// ClickHouse exception.
type statusError struct {
	code   proto.Error
	status int
	msg    string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("Code: %d. DB::Exception: %s", int(e.code), e.msg)
}

func newError(code proto.Error, status int, format string, args ...any) *statusError {
	return &statusError{code: code, status: status, msg: fmt.Sprintf(format, args...) + ". (" + code.String() + ")"}
}
