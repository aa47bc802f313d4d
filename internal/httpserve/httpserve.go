// Package httpserve runs an http.Server for as long as a context lives,
// then stops it gracefully: the one serve-then-shutdown of the collector's,
// the store's, the web's and the node agent's servers.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Serve serves srv on ln (with TLS when srv.TLSConfig is set) until ctx
// ends, then shuts srv down: requests in flight get grace to finish, and
// those still running after it (streams) are cut. It returns the serve
// error when serving stopped before ctx ended, nil otherwise. ln is
// closed when Serve returns.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() {
		if srv.TLSConfig != nil {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		_ = srv.Close() // streams still running after grace: cut them
	}
	<-errc // http.ErrServerClosed
	return nil
}
