package chdb

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// EnvLibPath names the environment variable that points at libchdb.so.
const EnvLibPath = "CHDB_LIB_PATH"

// libRelPath is where `make deps` (scripts/deps.sh) puts the library,
// relative to the repository root.
const libRelPath = ".cache/chdb/current/libchdb.so"

// systemLibPath is the conventional system-wide install location.
const systemLibPath = "/usr/local/lib/libchdb.so"

// ErrLibraryNotFound is returned (wrapped) by FindLibrary and Open when no
// libchdb.so could be found in any of the searched locations.
var ErrLibraryNotFound = errors.New("libchdb.so not found")

// FindLibrary returns the path of libchdb.so. It tries, in order: explicit
// (when not empty), $CHDB_LIB_PATH, <dir of executable>/../.cache/chdb/current,
// ./.cache/chdb/current, the same path in every parent of the working
// directory (so tests in subpackages find the repository's copy) and
// /usr/local/lib. An explicit path or $CHDB_LIB_PATH that does not exist is an
// error rather than a reason to fall through: the caller asked for that file.
func FindLibrary(explicit string) (string, error) {
	if explicit != "" {
		return existing(explicit, "Config.LibPath")
	}
	if env := os.Getenv(EnvLibPath); env != "" {
		return existing(env, "$"+EnvLibPath)
	}
	var tried []string
	try := func(p string) bool {
		if p == "" {
			return false
		}
		tried = append(tried, p)
		st, err := os.Stat(p)
		return err == nil && !st.IsDir()
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), "..", libRelPath); try(p) {
			return filepath.Clean(p), nil
		}
	}
	if wd, err := os.Getwd(); err == nil {
		for dir := wd; ; dir = filepath.Dir(dir) {
			if p := filepath.Join(dir, libRelPath); try(p) {
				return p, nil
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	if try(systemLibPath) {
		return systemLibPath, nil
	}
	return "", fmt.Errorf("%w (looked in %s, set $%s, or run `make deps` to fetch it)",
		ErrLibraryNotFound, strings.Join(tried, ", "), EnvLibPath)
}

func existing(p, from string) (string, error) {
	st, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("%w: %s=%q: %v (run `make deps` to fetch it)", ErrLibraryNotFound, from, p, err)
	}
	if st.IsDir() {
		return "", fmt.Errorf("%w: %s=%q is a directory", ErrLibraryNotFound, from, p)
	}
	return p, nil
}

// lib holds the functions of a loaded libchdb.so. Signatures follow
// programs/local/chdb.h of chDB 26.7. Opaque handles (chdb_connection,
// chdb_result *, chdb_insert_stream) are uintptr so the Go GC never looks at
// them; buffers the engine owns come back as *byte.
type lib struct {
	path string

	version                  func() string
	setSignalHandlersEnabled func(enabled int32)
	connect                  func(argc int32, argv []*byte) *uintptr // chdb_connection *
	closeConn                func(conn *uintptr)
	queryN                   func(conn uintptr, query *byte, queryLen uintptr, format *byte, formatLen uintptr) uintptr
	queryWithParamsN         func(conn uintptr, query *byte, queryLen uintptr, format *byte, formatLen uintptr, names []*byte, nameLens []uintptr, values []*byte, valueLens []uintptr, count uintptr) uintptr
	destroyQueryResult       func(res uintptr)
	resultBuffer             func(res uintptr) *byte
	resultLength             func(res uintptr) uintptr
	resultElapsed            func(res uintptr) float64
	resultRowsRead           func(res uintptr) uint64
	resultBytesRead          func(res uintptr) uint64
	resultRowsWritten        func(res uintptr) uint64
	resultBytesWritten       func(res uintptr) uint64
	resultError              func(res uintptr) *byte
	streamInsertN            func(conn uintptr, query *byte, queryLen uintptr, format *byte, formatLen uintptr) uintptr
	streamAppend             func(stream uintptr, data *byte, n uintptr) int32
	streamDone               func(stream uintptr) uintptr
	streamCancelInsert       func(stream uintptr)
	streamInsertError        func(stream uintptr) *byte
	destroyInsertStream      func(stream uintptr)
}

var (
	libMu     sync.Mutex
	loadedLib *lib
)

// loadLibrary dlopens libchdb.so once per process. A later call with a
// different path fails: the engine keeps process-wide state.
func loadLibrary(explicit string) (*lib, error) {
	libMu.Lock()
	defer libMu.Unlock()
	path, err := FindLibrary(explicit)
	if err != nil {
		if loadedLib != nil && explicit == "" {
			return loadedLib, nil
		}
		return nil, err
	}
	if loadedLib != nil {
		if !samePath(loadedLib.path, path) {
			return nil, fmt.Errorf("chdb: library already loaded from %s, cannot also load %s", loadedLib.path, path)
		}
		return loadedLib, nil
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("chdb: load %s: %w", path, err)
	}
	l := &lib{path: path}
	syms := []struct {
		fptr any
		name string
	}{
		{&l.version, "chdb_version"},
		{&l.setSignalHandlersEnabled, "chdb_set_signal_handlers_enabled"},
		{&l.connect, "chdb_connect"},
		{&l.closeConn, "chdb_close_conn"},
		{&l.queryN, "chdb_query_n"},
		{&l.queryWithParamsN, "chdb_query_with_params_n"},
		{&l.destroyQueryResult, "chdb_destroy_query_result"},
		{&l.resultBuffer, "chdb_result_buffer"},
		{&l.resultLength, "chdb_result_length"},
		{&l.resultElapsed, "chdb_result_elapsed"},
		{&l.resultRowsRead, "chdb_result_rows_read"},
		{&l.resultBytesRead, "chdb_result_bytes_read"},
		{&l.resultRowsWritten, "chdb_result_rows_written"},
		{&l.resultBytesWritten, "chdb_result_bytes_written"},
		{&l.resultError, "chdb_result_error"},
		{&l.streamInsertN, "chdb_stream_insert_n"},
		{&l.streamAppend, "chdb_stream_append"},
		{&l.streamDone, "chdb_stream_done"},
		{&l.streamCancelInsert, "chdb_stream_cancel_insert"},
		{&l.streamInsertError, "chdb_stream_insert_error"},
		{&l.destroyInsertStream, "chdb_destroy_insert_stream"},
	}
	for _, s := range syms {
		addr, err := purego.Dlsym(h, s.name)
		if err != nil {
			_ = purego.Dlclose(h)
			return nil, fmt.Errorf("chdb: %s lacks %s (need chDB 26.7 or later): %w", path, s.name, err)
		}
		purego.RegisterFunc(s.fptr, addr)
	}
	// Keep Go's SIGSEGV/SIGBUS/SIGABRT handlers: with chDB's installed, a
	// recoverable Go panic (nil dereference) hangs the process.
	l.setSignalHandlersEnabled(0)
	loadedLib = l
	return l, nil
}

func samePath(a, b string) bool {
	if a == b {
		return true
	}
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	return errA == nil && errB == nil && ra == rb
}
