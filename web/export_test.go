package web

import "net/http"

// Handler returns the server's handler (API and UI).
func (s *Server) Handler() http.Handler { return s.handler }
