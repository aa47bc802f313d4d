// Package inject sends traceflow probes from inside a pod's network
// namespace and captures them where they arrive, with raw AF_PACKET
// sockets (pure Go, no cgo, no libpcap).
//
// The sockets are created inside the namespace (package nsrun) and
// stay there for their whole life, so the caller's goroutines never change
// namespace. Linux only: elsewhere every function returns ErrUnsupported.
package inject

import "errors"

// ErrUnsupported is returned on systems without AF_PACKET.
var ErrUnsupported = errors.New("probe injection needs Linux")
