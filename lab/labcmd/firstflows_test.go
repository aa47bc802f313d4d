package labcmd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/internal/chsql"
)

// answers is a store.Conn whose queries get the next answer of a list
// (the last one repeats): what the demo's first-flow report sees of a
// store that starts, then holds no flows, then some.
type answers struct {
	mu  sync.Mutex
	out []string
	err []error
	q   []string
}

func (a *answers) Query(_ context.Context, q, format string) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if format != "JSONEachRow" {
		return nil, errors.New("format " + format)
	}
	a.q = append(a.q, q)
	i := min(len(a.q)-1, len(a.out)-1)
	return []byte(a.out[i]), a.err[i]
}
func (a *answers) Exec(context.Context, string) error { return errors.New("not used") }
func (a *answers) InsertRowBinary(context.Context, string, []string, string, int, []byte) error {
	return errors.New("not used")
}
func (a *answers) Close() error { return nil }

func TestReportFirstFlows(t *testing.T) {
	conn := &answers{
		out: []string{"", "", `{"ip_version":4,"n":3}` + "\n" + `{"ip_version":6,"n":2}` + "\n"},
		err: []error{errors.New("store starting"), nil, nil},
	}
	var out bytes.Buffer
	started := time.Now()
	reportFirstFlows(t.Context(), conn, "df", started, "http://127.0.0.1:1/", &out, slog.New(slog.NewTextHandler(io.Discard, nil)))
	got := out.String()
	if !strings.HasPrefix(got, "First flows stored ") || !strings.Contains(got, "(IPv4 3, IPv6 2): http://127.0.0.1:1/#/flows\n") {
		t.Fatalf("report %q", got)
	}
	if len(conn.q) != 3 || !strings.Contains(conn.q[0], "FROM `df`.flows WHERE flow_end >= "+chsql.Time(started)) {
		t.Fatalf("queries %q: want 3 on df.flows since the start (an error, none, then flows)", conn.q)
	}
}

func TestReportFirstFlowsStops(t *testing.T) {
	conn := &answers{out: []string{""}, err: []error{nil}}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var out bytes.Buffer
	go func() {
		reportFirstFlows(ctx, conn, "df", time.Now(), "", &out, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("reportFirstFlows did not return after its context ended")
	}
	if out.Len() != 0 {
		t.Fatalf("printed %q without flows", out.String())
	}
}
