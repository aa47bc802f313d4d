// Package ui holds the browser UI: static HTML, JavaScript and CSS
// embedded in the binary (no CDN, no build step), served by web.Server.
package ui

import (
	"cmp"
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed static
var static embed.FS

// Handler serves the UI's files; unknown paths get index.html so pages
// reached by their #fragment reload.
func Handler() http.Handler {
	sub, _ := fs.Sub(static, "static")
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		if _, err := fs.Stat(sub, cmp.Or(strings.TrimLeft(r.URL.Path, "/"), ".")); err != nil {
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/"
			files.ServeHTTP(w, r2)
			return
		}
		files.ServeHTTP(w, r)
	})
}
