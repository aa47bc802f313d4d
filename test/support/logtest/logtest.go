// Package logtest is a log to assert on in tests: a concurrency-safe
// buffer behind a text slog.Logger.
package logtest

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Buffer collects log output; the zero value is ready. It is safe for
// concurrent use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything logged so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines returns the lines containing s.
func (b *Buffer) Lines(s string) []string {
	var out []string
	for l := range strings.SplitSeq(b.String(), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// Logger returns a text logger writing to b.
func (b *Buffer) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
