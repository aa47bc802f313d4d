// Package chhttp serves the ClickHouse HTTP interface over the embedded
// engine, so users and tools reach the collector's chDB store the way they
// would reach a ClickHouse server: curl, clickhouse-client's HTTP mode, and
// unmodified clickhouse-go/v2 with Protocol: clickhouse.HTTP.
//
// It answers GET and POST on / (query in the "query" parameter and/or the
// body; INSERT data in the body is streamed to the engine), /ping and
// /replicas_status. URL parameters follow ClickHouse: default_format,
// database, param_<name> for server-side {name:Type} parameters, and any
// other engine setting (readonly, max_result_rows, max_execution_time, ...)
// applied to that request only. GET requests are read-only, as in
// ClickHouse. Results are buffered whole before the reply, so a failed
// query always gets a proper error status; bound them with max_result_rows
// or max_result_bytes.
package chhttp

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/collector/store/sqlguard"
	"github.com/dualflow/dualflow/internal/defaults"
	"github.com/dualflow/dualflow/internal/httpserve"
	"github.com/dualflow/dualflow/netaddr"
)

// Engine runs statements; *chdb.DB implements it.
type Engine interface {
	// Run runs one statement and returns its whole output.
	Run(ctx context.Context, st chdb.Statement) (*chdb.Result, error)
	// InsertStatement streams data into an INSERT ... FORMAT statement.
	InsertStatement(ctx context.Context, st chdb.Statement, data io.Reader) (chdb.Stats, error)
}

var _ Engine = (*chdb.DB)(nil)

// Defaults for Config.
const (
	DefaultAddr            = "127.0.0.1:8123"
	DefaultMaxQuerySize    = 1 << 20 // bytes of query text in a body; INSERT data is streamed and not capped
	DefaultMaxConcurrent   = 32      // requests served at once; the engine runs chdb.Config.MaxConns of them in parallel
	DefaultShutdownTimeout = 10 * time.Second
	DefaultBodyTimeout     = 30 * time.Second
	// readersPerSlot bounds requests still sending their query text, per
	// engine slot, so that slow senders cannot hold engine slots (nor
	// unbounded memory: each reads at most MaxQuerySize bytes).
	readersPerSlot = 4
	// readHeaderTimeout bounds slow clients before a request is parsed.
	readHeaderTimeout = 10 * time.Second
	// maxHeaderBytes caps the request line plus headers, so the URL too.
	maxHeaderBytes = 1 << 20
)

// Config configures a Server.
type Config struct {
	// Addr is the listen address for Run, IPv4 or IPv6 ("[::1]:8123");
	// empty means DefaultAddr.
	Addr string
	// Engine runs the statements. Required.
	Engine Engine
	// ReadOnly forces readonly=1 on every request (no writes, no settings
	// changes, no table functions), e.g. for a public SQL endpoint.
	ReadOnly bool
	// MaxQuerySize caps the query text read from a request body, in bytes;
	// 0 means DefaultMaxQuerySize. INSERT data after the query is not capped.
	MaxQuerySize int
	// MaxConcurrent caps requests being served at once; more get HTTP 503
	// with code 202 (TOO_MANY_SIMULTANEOUS_QUERIES). 0 means DefaultMaxConcurrent.
	MaxConcurrent int
	// Users are the accounts that may authenticate (see LoadOrCreateUsers).
	Users []User
	// Anonymous is what a request without credentials may do. The zero
	// value refuses it: the interface authenticates by default. AccessFull
	// is for a Handler mounted behind its own authentication, and tests.
	Anonymous Access
	// BodyTimeout bounds reading a request's query text, and the wait for
	// each next chunk of an INSERT's data; 0 means DefaultBodyTimeout. A
	// request holds an engine slot only once its query text has arrived.
	BodyTimeout time.Duration
	// ShutdownTimeout bounds how long Run waits for requests in flight
	// after its context is cancelled; 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// EngineSlots is how many statements the engine runs at once
	// (chdb.Config.MaxConns); 0 means chdb.DefaultMaxConns. Requests other
	// than an inserter's INSERTs use at most EngineSlots-1 of them (waiting
	// up to 5 s for one), one user who is not an admin at most
	// EngineSlots-2 (at least 1): the collectors' inserts always find a
	// slot, and one reader cannot take the others'.
	EngineSlots int
	// MaxRequestTime bounds a request from its arrival to its answer: a
	// statement still running is killed. 0 means DefaultMaxRequestTime.
	MaxRequestTime time.Duration
	// MinDataRate is the least average rate, in bytes per second, at
	// which an INSERT's data must arrive after DataRateGrace; 0 means
	// DefaultMinDataRate, negative no minimum.
	MinDataRate int
	// ReadersPerUser caps one user's requests still sending their query
	// text (without credentials: one source, an IPv4 /24 or IPv6 /64); 0
	// means DefaultReadersPerUser.
	ReadersPerUser int
	// ReaderLimits are the limits of read-only users' statements; zero
	// fields take DefaultReaderLimits'.
	ReaderLimits ReaderLimits
	// DisplayName is sent as X-ClickHouse-Server-Display-Name; empty means
	// the host name.
	DisplayName string
	// Registerer receives the server's metrics; nil means no metrics.
	Registerer prometheus.Registerer
	// Logger logs failed requests; nil means slog.Default().
	Logger *slog.Logger
}

// Server is a ClickHouse HTTP interface over an Engine.
type Server struct {
	cfg     Config
	log     *slog.Logger
	sem     chan struct{} // one token per request being served; full → 503
	readers chan struct{} // one token per request reading its query text; full → 503
	general chan struct{} // one token per request using the engine but an inserter's INSERT; EngineSlots-1, full → 503
	perUser *userGate
	auth    *authenticator
	metrics *metrics
	handler http.Handler
}

// New checks cfg and returns a Server. It does not listen; see Run,
// Serve and Handler.
func New(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("chhttp: Config.Engine is required")
	}
	cfg.Addr = cmp.Or(cfg.Addr, DefaultAddr)
	cfg.MaxQuerySize = defaults.Positive(cfg.MaxQuerySize, DefaultMaxQuerySize)
	cfg.MaxConcurrent = defaults.Positive(cfg.MaxConcurrent, DefaultMaxConcurrent)
	cfg.ShutdownTimeout = defaults.Positive(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	cfg.BodyTimeout = defaults.Positive(cfg.BodyTimeout, DefaultBodyTimeout)
	cfg.EngineSlots = defaults.Positive(cfg.EngineSlots, chdb.DefaultMaxConns)
	cfg.MaxRequestTime = defaults.Positive(cfg.MaxRequestTime, DefaultMaxRequestTime)
	cfg.MinDataRate = cmp.Or(cfg.MinDataRate, DefaultMinDataRate)
	cfg.ReadersPerUser = defaults.Positive(cfg.ReadersPerUser, DefaultReadersPerUser)
	cfg.ReaderLimits.setDefaults()
	if cfg.DisplayName == "" {
		cfg.DisplayName, _ = os.Hostname()
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	auth, err := newAuthenticator(cfg.Users, cfg.Anonymous)
	if err != nil {
		return nil, err
	}
	general := max(1, cfg.EngineSlots-1)
	s := &Server{cfg: cfg, log: cfg.Logger, sem: make(chan struct{}, cfg.MaxConcurrent),
		readers: make(chan struct{}, readersPerSlot*cfg.MaxConcurrent), auth: auth, metrics: newMetrics(cfg.Registerer),
		general: make(chan struct{}, general), perUser: newUserGate(cfg.ReadersPerUser, max(1, general-1))}
	mux := http.NewServeMux()
	mux.HandleFunc("/ping", s.ping)
	mux.HandleFunc("/replicas_status", s.ping)
	mux.HandleFunc("/{$}", s.serveQuery)
	mux.HandleFunc("/", s.notFound)
	s.handler = s.recoverPanics(s.rejectBrowsers(mux))
	return s, nil
}

// rejectBrowsers refuses requests a web browser sends on behalf of another
// site, and requests whose Host is a name other than localhost. The interface has no authentication and listens on loopback, so any
// page the user opens could otherwise POST SQL (DROP TABLE, url() table
// functions) to it. ClickHouse clients, curl and dualflow send neither
// header; browsers send Sec-Fetch-Site and, on cross-origin requests, Origin.
func (s *Server) rejectBrowsers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// DNS rebinding: a page of the attacker's name, rebound to
		// 127.0.0.1, is same-origin with itself, so the Origin check alone
		// lets it in; its requests carry the attacker's name as Host.
		if !netaddr.HostAllowed(r.Host, nil) {
			s.metrics.requests.WithLabelValues("other", "403").Inc()
			s.writeError(w, newError(proto.ErrAccessDenied, http.StatusForbidden,
				"Host %q refused: the interface answers only to an IP address or localhost (DNS rebinding protection)", r.Host))
			return
		}
		site := r.Header.Get("Sec-Fetch-Site")
		origin := r.Header.Get("Origin")
		crossSite := (site != "" && site != "same-origin" && site != "none") ||
			(origin != "" && origin != "http://"+r.Host && origin != "https://"+r.Host)
		if crossSite {
			s.metrics.requests.WithLabelValues("other", "403").Inc()
			s.writeError(w, newError(proto.ErrAccessDenied, http.StatusForbidden,
				"cross-site browser requests are refused (Origin %q, Sec-Fetch-Site %q)", origin, site))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// vet checks a statement with the engine's parse, under the request's
// settings (without its row limits: a parse has a line per node): a
// read-only request's by sqlguard.Vet, another's by
// sqlguard.VetStatement (one statement, no INTO OUTFILE).
func (s *Server) vet(ctx context.Context, st chdb.Statement, readOnly bool) error {
	settings := maps.Clone(st.Settings)
	delete(settings, "max_result_rows")
	delete(settings, "result_overflow_mode")
	run := func(ctx context.Context, q, format string) ([]byte, error) {
		res, err := s.cfg.Engine.Run(ctx, chdb.Statement{Query: q, Format: format, Settings: settings, Params: st.Params, Database: st.Database})
		if err != nil {
			return nil, err
		}
		return res.Data, nil
	}
	var err error
	if readOnly {
		err = sqlguard.Vet(ctx, run, st.Database, st.Query)
	} else {
		err = sqlguard.VetStatement(ctx, run, st.Query)
	}
	var re *sqlguard.RefusedError
	if errors.As(err, &re) {
		s.metrics.refused.WithLabelValues(re.Reason).Inc()
		// What ClickHouse answers a read-only user: READONLY, HTTP 500.
		return newError(proto.ErrReadonly, httpStatus(proto.ErrReadonly), "Cannot execute query in readonly mode: %v", err)
	}
	var na *sqlguard.NotAcceptedError
	if errors.As(err, &na) {
		s.metrics.refused.WithLabelValues("engine").Inc()
		return na.Err // the engine's own error, as ClickHouse would give it
	}
	return err
}

// Handler returns the HTTP handler, for tests and for mounting elsewhere.
func (s *Server) Handler() http.Handler { return s.handler }

// Run listens on Config.Addr and serves until ctx is cancelled, then shuts
// down gracefully: it stops accepting, waits up to Config.ShutdownTimeout
// for requests in flight, and returns nil. It returns early on a listen or
// serve error.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("chhttp: listen %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an existing listener, which it closes.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	if err := httpserve.Serve(ctx, srv, ln, s.cfg.ShutdownTimeout); err != nil {
		return fmt.Errorf("chhttp: serve %s: %w", ln.Addr(), err)
	}
	return nil
}

func (s *Server) ping(w http.ResponseWriter, r *http.Request) {
	s.metrics.requests.WithLabelValues("ping", "200").Inc()
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	_, _ = io.WriteString(w, "Ok.\n")
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	s.metrics.requests.WithLabelValues("other", "404").Inc()
	w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, "There is no handle %s\n\nUse / or /ping for health checks.\n", r.URL.Path)
}

// recoverPanics turns a handler panic into a 500 answer and a log line
// instead of a dropped connection.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.metrics.errors.WithLabelValues("panic").Inc()
				s.log.Error("chhttp: handler panic", "panic", p, "stack", string(debug.Stack()))
				s.writeError(w, newError(proto.ErrStdException, http.StatusInternalServerError, "internal error: %v", p))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// serveQuery is the ClickHouse HTTP interface's main handler.
func (s *Server) serveQuery(w http.ResponseWriter, r *http.Request) {
	user, access, err := s.auth.authenticate(r)
	if access == AccessNone {
		s.metrics.authFailures.Inc()
		s.log.Debug("chhttp: authentication failed", "user", user, "remote", r.RemoteAddr)
		// As ClickHouse: no password is REQUIRED_PASSWORD (401, with a
		// challenge so that curl and browsers ask), a wrong one
		// AUTHENTICATION_FAILED (403).
		if user == "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="ClickHouse", charset="UTF-8"`)
			s.writeError(w, newError(proto.ErrRequiredPassword, http.StatusUnauthorized, "%v", err))
			s.metrics.requests.WithLabelValues("query", "401").Inc()
		} else {
			s.metrics.requests.WithLabelValues("query", "403").Inc()
			s.writeError(w, newError(proto.ErrAuthenticationFailed, http.StatusForbidden, "%v", err))
		}
		return
	}
	who := cmp.Or(user, "anonymous@"+sourceKey(r.RemoteAddr))
	kind, err := s.handle(w, r, who, access)
	switch {
	case errors.Is(err, errNoReader):
		s.reject(w, "Too many requests sending their query. Maximum: %d", cap(s.readers))
		return
	case errors.Is(err, errUserReaders):
		s.metrics.refused.WithLabelValues("user_readers").Inc()
		s.reject(w, "Too many requests of this user sending their query. Maximum: %d", s.cfg.ReadersPerUser)
		return
	case errors.Is(err, errNoSlot):
		s.reject(w, "Too many simultaneous queries. Maximum: %d", s.cfg.MaxConcurrent)
		return
	case errors.Is(err, errNoEngine):
		s.reject(w, "Too many simultaneous queries on the engine (one of its slots is kept for the collectors' inserts). Maximum: %d", cap(s.general))
		return
	case errors.Is(err, errUserEngine):
		s.metrics.refused.WithLabelValues("user_engine").Inc()
		s.reject(w, "Too many simultaneous queries of this user. Maximum: %d", s.perUser.maxEngine)
		return
	}
	status := http.StatusOK
	if err != nil {
		status = s.fail(w, r, who, kind, err)
	}
	s.metrics.requests.WithLabelValues(kind, strconv.Itoa(status)).Inc()
}

// Answers of handle when a place is taken: 503 with
// TOO_MANY_SIMULTANEOUS_QUERIES, as ClickHouse answers past
// max_concurrent_queries.
var (
	errNoReader    = errors.New("no place to read the query")
	errUserReaders = errors.New("the user's places to read queries are taken")
	errNoSlot      = errors.New("no request slot")
	errNoEngine    = errors.New("no engine slot")
	errUserEngine  = errors.New("the user's engine slots are taken")
)

func (s *Server) reject(w http.ResponseWriter, format string, max int) {
	s.metrics.rejected.Inc()
	s.metrics.requests.WithLabelValues("query", "503").Inc()
	// Answer now and close: the server would otherwise read what is left
	// of the body first, as slowly as the client sends it.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", "1")
	s.writeError(w, newError(proto.ErrTooManySimultaneousQueries, http.StatusServiceUnavailable, format, max))
}

// sourceKey names a client by its network: an IPv4 /24, an IPv6 /64, or
// "loopback" (every local user may use any 127.x or ::1 source).
func sourceKey(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return remote
	}
	a := ap.Addr().Unmap()
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.Is4():
		p, _ := a.Prefix(24)
		return p.String()
	default:
		p, _ := a.Prefix(64)
		return p.String()
	}
}

// handle serves one request of who (a user, or an anonymous source); on
// error nothing has been written yet. It reads the query text in one of
// the reading places (at most ReadersPerUser of them for who), and only
// then takes an engine slot, so slow senders hold no slot. A read-only
// request (a read-only user, GET, readonly=N) never reaches the insert
// path, and runs only what sqlguard.Vet accepts; an inserter's INSERT has
// a slot of its own; any other statement must be one statement without
// INTO OUTFILE.
func (s *Server) handle(w http.ResponseWriter, r *http.Request, who string, access Access) (kind string, err error) {
	kind = "query"
	start := time.Now()
	ctx, cancel := context.WithDeadline(r.Context(), start.Add(s.cfg.MaxRequestTime))
	defer cancel()
	select {
	case s.readers <- struct{}{}:
	default:
		return kind, errNoReader
	}
	leaveReading, ok := s.perUser.enter("reading", who)
	if !ok {
		<-s.readers
		return kind, errUserReaders
	}
	reading := true
	defer func() {
		if reading {
			leaveReading()
			<-s.readers
		}
	}()
	req, err := parseRequest(r.Method, r.URL, r.Header)
	if err != nil {
		return kind, err
	}
	if s.cfg.ReadOnly {
		req.settings["readonly"] = "1"
	}
	rc := http.NewResponseController(w)
	// The query text must arrive within BodyTimeout; INSERT data after it
	// at MinDataRate (paceReader).
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	body, closeBody, err := requestBody(r.Body, r.Header.Get("Content-Encoding"), req.nativeDecompress)
	if err != nil {
		return kind, err
	}
	defer closeBody()

	// The query text is the query parameter, a newline, then the body; an
	// INSERT's data follows its FORMAT clause. Read at most MaxQuerySize
	// bytes of body to find out which.
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(body, int64(s.cfg.MaxQuerySize)+1)); err != nil {
		return kind, readError(err)
	}
	prefix := buf.Bytes()
	exhausted := len(prefix) <= s.cfg.MaxQuerySize
	text := req.query
	if text != "" && len(prefix) > 0 {
		text += "\n"
	}
	text += string(prefix)
	if strings.TrimSpace(text) == "" {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			// ClickHouse answers a bare GET / like /ping.
			w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
			_, _ = io.WriteString(w, "Ok.\n")
			return "ping", nil
		}
		return kind, newError(proto.ErrSyntaxError, http.StatusBadRequest, "Empty query")
	}
	leaveReading()
	<-s.readers
	reading = false

	ins, isInsert := chdb.SplitInsert(text)
	isInsert = isInsert && ins.DataOffset >= len(req.query)
	ro := req.settings["readonly"]
	readOnly := access == AccessReadOnly || ro == "1" || ro == "2" || (access == AccessInsert && !isInsert)
	if isInsert {
		kind = "insert"
		switch {
		case readOnly:
			// The reader's INSERT INTO FUNCTION file(...) used to reach the
			// engine, which readonly=2 does not stop from writing the file.
			s.metrics.refused.WithLabelValues("insert").Inc()
			return kind, newError(proto.ErrReadonly, httpStatus(proto.ErrReadonly), "Cannot execute query in readonly mode: INSERT by a read-only user or request")
		case access == AccessInsert && ins.Function:
			s.metrics.refused.WithLabelValues("insert_function").Inc()
			return kind, newError(proto.ErrAccessDenied, httpStatus(proto.ErrAccessDenied), "user %s may insert into tables only, not into a table function", who)
		}
	}
	select {
	case s.sem <- struct{}{}:
	default:
		return kind, errNoSlot
	}
	defer func() { <-s.sem }()
	// Every request but an inserter's INSERT shares EngineSlots-1 engine
	// slots, and each user but an admin at most one less: the collectors'
	// inserts and the other users always find one.
	if !isInsert || access != AccessInsert {
		if access != AccessFull {
			leave, ok := s.perUser.enter("engine", who)
			if !ok {
				return kind, errUserEngine
			}
			defer leave()
		}
		// As ClickHouse past max_concurrent_queries: wait a little for a
		// slot (queue_max_wait_ms), then refuse.
		wait := time.NewTimer(queueWait)
		select {
		case s.general <- struct{}{}:
			wait.Stop()
		case <-wait.C:
			return kind, errNoEngine
		case <-ctx.Done():
			wait.Stop()
			return kind, errNoEngine
		}
		defer func() { <-s.general }()
	}
	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()
	var minRate float64
	if s.cfg.MinDataRate > 0 {
		minRate = float64(s.cfg.MinDataRate)
	}
	pace := &paceReader{r: body, rc: rc, stall: s.cfg.BodyTimeout, minRate: minRate, start: start, end: start.Add(s.cfg.MaxRequestTime)}

	settings := req.settings
	if access == AccessReadOnly || (access == AccessInsert && !isInsert) {
		// A read-only user's statement runs under the server's limits:
		// URL settings may lower them and format the answer, nothing else.
		if settings, err = readerStatementSettings(req.settings, s.cfg.ReaderLimits); err != nil {
			s.metrics.refused.WithLabelValues("settings").Inc()
			return kind, err
		}
	} else if readOnly && ro != "1" {
		// As a ClickHouse user with readonly=2: settings may change,
		// nothing may be written.
		settings["readonly"] = "2"
	}
	st := chdb.Statement{Format: req.format, Params: req.params, Settings: settings, Database: req.database}
	h := w.Header()
	h.Set("X-ClickHouse-Query-Id", cmp.Or(req.queryID, uuid.NewString()))
	h.Set("X-ClickHouse-Server-Display-Name", s.cfg.DisplayName)
	h.Set("X-ClickHouse-Timezone", "UTC")

	if isInsert {
		if !exhausted && ins.DataOffset == len(text) {
			return kind, newError(proto.ErrQueryIsTooLarge, http.StatusRequestEntityTooLarge, "INSERT statement longer than %d bytes", s.cfg.MaxQuerySize)
		}
		st.Query = text[:ins.DataOffset]
		data := io.MultiReader(strings.NewReader(text[ins.DataOffset:]), pace)
		stats, err := s.cfg.Engine.InsertStatement(ctx, st, data)
		if err != nil {
			if pace.tooSlow {
				s.metrics.refused.WithLabelValues("slow").Inc()
				return kind, newError(proto.ErrTimeoutExceeded, httpStatus(proto.ErrTimeoutExceeded), "the INSERT's data arrives too slowly: %d bytes in %s, below %d bytes/s (after %s); send it faster, or in smaller INSERTs", pace.n, time.Since(start).Round(time.Second), s.cfg.MinDataRate, DataRateGrace)
			}
			if ctx.Err() != nil && r.Context().Err() == nil {
				return kind, newError(proto.ErrTimeoutExceeded, httpStatus(proto.ErrTimeoutExceeded), "the request took longer than %s", s.cfg.MaxRequestTime)
			}
			return kind, err
		}
		s.metrics.insertedRows.Add(float64(stats.RowsWritten))
		h.Set("X-ClickHouse-Summary", summary(stats, 0))
		h.Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return kind, nil
	}
	if !exhausted {
		return kind, newError(proto.ErrQueryIsTooLarge, http.StatusRequestEntityTooLarge, "Query is too large (more than %d bytes in the body)", s.cfg.MaxQuerySize)
	}

	st.Query = text
	format := cmp.Or(chdb.OutputFormat(text), req.format)
	// A read-only request reads the store only: the engine would still
	// write files (INTO OUTFILE), show system.processes, KILL, and run a
	// second statement. Any other runs one statement without INTO OUTFILE
	// (sqlguard).
	if err := s.vet(ctx, st, readOnly); err != nil {
		return kind, err
	}
	res, err := s.cfg.Engine.Run(ctx, st)
	if err != nil && ctx.Err() != nil && r.Context().Err() == nil {
		return kind, newError(proto.ErrTimeoutExceeded, httpStatus(proto.ErrTimeoutExceeded), "the request took longer than %s", s.cfg.MaxRequestTime)
	}
	if err != nil {
		return kind, err
	}
	data := res.Data
	if strings.EqualFold(format, "Native") && req.protocolVersion > 0 {
		if data, err = reencodeNative(data, req.protocolVersion); err != nil {
			return kind, newError(proto.ErrStdException, http.StatusInternalServerError, "%v", err)
		}
	}
	h.Set("X-ClickHouse-Format", format)
	h.Set("Content-Type", contentType(format))
	h.Set("X-ClickHouse-Summary", summary(res.Stats, len(data)))
	switch {
	case req.nativeCompress:
		if data, err = nativeCompressed(data, req.nativeMethod); err != nil {
			return kind, newError(proto.ErrStdException, http.StatusInternalServerError, "compress response: %v", err)
		}
	case responseEncoding(r.Header.Get("Accept-Encoding"), req.httpCompression) != "":
		enc := responseEncoding(r.Header.Get("Accept-Encoding"), req.httpCompression)
		h.Set("Content-Encoding", enc)
		h.Add("Vary", "Accept-Encoding")
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_ = writeCompressed(w, enc, data) // the client went away; nothing to tell it
		}
		return kind, nil
	}
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(data)
	}
	return kind, nil
}

// readError classifies a failure to read the request body.
func readError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return newError(proto.ErrQueryIsTooLarge, http.StatusRequestEntityTooLarge, "request body too large: %v", err)
	}
	return newError(proto.ErrCannotDecompress, http.StatusBadRequest, "cannot read request body: %v", err)
}

// fail writes err as a ClickHouse exception and returns the status sent.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, who, kind string, err error) int {
	var (
		se     *statusError
		ce     *chdb.Error
		reason string
	)
	switch {
	case errors.As(err, &se):
		reason = "request"
	case errors.As(err, &ce) && ce.Code != 0:
		reason = "engine"
		se = &statusError{code: proto.Error(ce.Code), status: httpStatus(proto.Error(ce.Code)), msg: ce.Message}
	case r.Context().Err() != nil:
		reason = "canceled"
		se = newError(proto.ErrQueryWasCancelled, 499, "query was cancelled: the client went away")
	default:
		reason = "internal"
		se = newError(proto.ErrStdException, http.StatusInternalServerError, "%v", err)
	}
	s.metrics.errors.WithLabelValues(reason).Inc()
	// A refusal (READONLY, ACCESS_DENIED: counted in refused_total) and a
	// user's query the engine rejects are the user's business, not the
	// server's failure.
	refusal := se.code == proto.ErrReadonly || se.code == proto.ErrAccessDenied
	if se.status >= 500 && reason != "canceled" && !refusal {
		s.log.Error("chhttp: request failed", "user", who, "kind", kind, "status", se.status, "code", int(se.code), "err", se.msg)
	} else {
		s.log.Debug("chhttp: request refused", "user", who, "kind", kind, "status", se.status, "code", int(se.code), "err", se.msg)
	}
	s.writeError(w, se)
	return se.status
}

func (s *Server) writeError(w http.ResponseWriter, se *statusError) {
	h := w.Header()
	h.Del("Content-Encoding")
	h.Del("X-ClickHouse-Format")
	h.Set("Content-Type", "text/plain; charset=UTF-8")
	h.Set("X-ClickHouse-Exception-Code", strconv.Itoa(int(se.code)))
	h.Set("X-ClickHouse-Server-Display-Name", s.cfg.DisplayName)
	w.WriteHeader(se.status)
	var b bytes.Buffer
	fmt.Fprintf(&b, "Code: %d. DB::Exception: %s\n", int(se.code), strings.TrimRight(se.msg, "\n"))
	_, _ = w.Write(b.Bytes())
}

// summary renders X-ClickHouse-Summary; ClickHouse sends the numbers as
// JSON strings.
func summary(st chdb.Stats, resultBytes int) string {
	return fmt.Sprintf(`{"read_rows":"%d","read_bytes":"%d","written_rows":"%d","written_bytes":"%d","total_rows_to_read":"0","result_rows":"%d","result_bytes":"%d","elapsed_ns":"%d"}`,
		st.RowsRead, st.BytesRead, st.RowsWritten, st.BytesWritten, st.RowsRead, resultBytes, st.Elapsed.Nanoseconds())
}

// contentType mirrors the Content-Type ClickHouse sends per output format.
func contentType(format string) string {
	f := strings.ToLower(format)
	switch {
	case f == "tabseparated" || f == "tsv" || strings.HasPrefix(f, "tabseparated") || strings.HasPrefix(f, "tsv"):
		return "text/tab-separated-values; charset=UTF-8"
	case strings.HasPrefix(f, "csv"):
		return "text/csv; charset=UTF-8; header=absent"
	case strings.HasPrefix(f, "json") || strings.HasPrefix(f, "ndjson"):
		return "application/json; charset=UTF-8"
	case f == "xml":
		return "application/xml; charset=UTF-8"
	case f == "native" || strings.HasPrefix(f, "rowbinary") || f == "parquet" || strings.HasPrefix(f, "arrow") || f == "orc" || f == "avro" || f == "msgpack" || f == "protobuf":
		return "application/octet-stream"
	}
	return "text/plain; charset=UTF-8"
}

type metrics struct {
	requests     *prometheus.CounterVec
	errors       *prometheus.CounterVec
	inFlight     prometheus.Gauge
	rejected     prometheus.Counter
	insertedRows prometheus.Counter
	refused      *prometheus.CounterVec
	authFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg) // registers on reg unless it is nil
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_chhttp_requests_total",
			Help: "ClickHouse HTTP interface requests by kind (query, insert, ping, other) and HTTP status.",
		}, []string{"kind", "code"}),
		errors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_chhttp_errors_total",
			Help: "Failed ClickHouse HTTP interface requests by reason (engine, request, canceled, internal, panic).",
		}, []string{"reason"}),
		inFlight: f.NewGauge(prometheus.GaugeOpts{
			Name: "dualflow_chhttp_in_flight_requests",
			Help: "ClickHouse HTTP interface requests being served.",
		}),
		rejected: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_chhttp_rejected_total",
			Help: "Requests answered 503 because MaxConcurrent requests were already being served.",
		}),
		insertedRows: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_chhttp_inserted_rows_total",
			Help: "Rows written by INSERTs through the ClickHouse HTTP interface.",
		}),
		authFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_chhttp_auth_failures_total",
			Help: "Requests refused with 401: no credentials where anonymous access is off, or a wrong user or password.",
		}),
		refused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_chhttp_refused_total",
			Help: "Requests refused before they ran, by reason: statement, outfile, settings, construct, table_function, function, table, engine (see sqlguard); insert (an INSERT of a read-only user or request), insert_function (an inserter's INSERT INTO FUNCTION), user_readers and user_engine (a user's cap of places), slow (data below the minimum rate).",
		}, []string{"reason"}),
	}
}
