package agent

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/traceflow"
)

type fakeTracer func(ctx context.Context, p traceflow.Probe) (traceflow.Path, error)

func (f fakeTracer) Trace(ctx context.Context, p traceflow.Probe) (traceflow.Path, error) {
	return f(ctx, p)
}

func probe(v6 bool) traceflow.Probe {
	p := traceflow.Probe{Family: traceflow.IPv4, SourcePod: "frontend/web-1", Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.19.0.11"),
		Service: "backend/api", Protocol: traceflow.TCP, SrcPort: 40000, DstPort: 80, TCPFlags: 2, Tag: 3}
	if v6 {
		p.Family, p.Src, p.Dst = traceflow.IPv6, netip.MustParseAddr("fd00:10:0:1::10"), netip.MustParseAddr("fd00:10:ff::11")
	}
	return p
}

func TestAgent(t *testing.T) {
	var got traceflow.Probe
	tr := fakeTracer(func(ctx context.Context, p traceflow.Probe) (traceflow.Path, error) {
		got = p
		if _, ok := ctx.Deadline(); !ok {
			t.Error("tracer context has no deadline")
		}
		if p.DstPort == 81 {
			<-ctx.Done()
			return traceflow.Path{}, ctx.Err()
		}
		return traceflow.Path{Outcome: traceflow.Delivered, Observations: []traceflow.Observation{
			{Node: "node-1", Component: traceflow.LoadBalancing, Action: traceflow.ActionForwarded, TranslatedDst: netip.MustParseAddrPort("[fd00:10:0:2::11]:8080")},
		}}, nil
	})
	srv := httptest.NewServer(Handler(tr, "s3cret"))
	defer srv.Close()
	ctx := func(d time.Duration) context.Context {
		c, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return c
	}
	for _, v6 := range []bool{false, true} {
		c := &Client{URL: srv.URL, Token: "s3cret"}
		path, err := c.Trace(ctx(2*time.Second), probe(v6))
		if err != nil {
			t.Fatal(err)
		}
		if got != probe(v6) {
			t.Errorf("agent got %+v, want %+v", got, probe(v6))
		}
		if path.Outcome != traceflow.Delivered || len(path.Observations) != 1 || path.Observations[0].TranslatedDst.Port() != 8080 {
			t.Errorf("path %+v", path)
		}
	}
	if _, err := (&Client{URL: srv.URL, Token: "wrong"}).Trace(ctx(time.Second), probe(false)); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("wrong token: %v", err)
	}
	if _, err := (&Client{URL: srv.URL}).Trace(ctx(time.Second), probe(false)); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("no token: %v", err)
	}
	if _, err := (&Client{URL: srv.URL, Token: "s3cret"}).Trace(context.Background(), probe(false)); err == nil {
		t.Error("no deadline: want an error")
	}
	p := probe(true)
	p.DstPort = 81
	path, err := (&Client{URL: srv.URL, Token: "s3cret"}).Trace(ctx(200*time.Millisecond+time.Second), p)
	if err != nil || path.Outcome != traceflow.TimedOut || !strings.Contains(path.Reason, "within") {
		t.Errorf("timeout: %+v %v", path, err)
	}
}

func TestLoadToken(t *testing.T) {
	t.Setenv(TokenEnv, "")
	if _, err := LoadToken(""); err == nil {
		t.Error("no token: want an error")
	}
	f := t.TempDir() + "/token"
	if err := writeFile(f, "abc\n"); err != nil {
		t.Fatal(err)
	}
	if tok, err := LoadToken(f); err != nil || tok != "abc" {
		t.Errorf("file token %q %v", tok, err)
	}
	t.Setenv(TokenEnv, "env")
	if tok, _ := LoadToken(f); tok != "env" {
		t.Errorf("env token %q", tok)
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o600) }
