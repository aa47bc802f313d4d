// Package nsrun runs Go code and commands inside a network namespace.
//
// Do runs a function on a fresh OS thread that has joined the namespace; the
// thread is never returned to the Go scheduler (it exits with its locked
// goroutine), so no other goroutine can ever run in the wrong namespace.
// Sockets created inside fn stay in that namespace for their whole life and
// may be used from any goroutine afterwards.
//
// Network namespaces exist on Linux only; elsewhere every function returns
// ErrUnsupported.
package nsrun

import "errors"

// Dir is where named network namespaces are bind-mounted (iproute2's choice).
const Dir = "/run/netns"

// Path returns the bind-mount path of the named namespace.
func Path(name string) string { return Dir + "/" + name }

// ErrUnsupported is returned on systems without network namespaces.
var ErrUnsupported = errors.New("network namespaces need Linux")
