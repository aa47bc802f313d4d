package httpserve

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestServe: a request in flight at shutdown finishes, a stream that
// outlives the grace is cut, and Serve returns nil once ctx ends.
func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 2)
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release // still running when shutdown starts
		io.WriteString(w, "done")
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		w.(http.Flusher).Flush()
		<-r.Context().Done() // never ends by itself
	})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, &http.Server{Handler: mux}, ln, 2*time.Second) }()
	base := "http://" + ln.Addr().String()
	slow := make(chan string, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	resp, err := http.Get(base + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	<-started
	cancel()
	// Shutdown has begun once the listener is closed; then let the slow
	// request finish.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts 30 s after cancel")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after its grace")
	}
	if got := <-slow; got != "done" {
		t.Errorf("request in flight at shutdown: %q, want done", got)
	}
}

// TestServeError: serving that fails (a closed listener) returns its error.
func TestServeError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := Serve(context.Background(), &http.Server{}, ln, time.Second); err == nil {
		t.Fatal("Serve on a closed listener returned nil")
	}
}
