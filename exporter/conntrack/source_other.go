//go:build !linux

package conntrack

import (
	"context"
	"errors"

	"github.com/dualflow/dualflow/exporter/connstore"
)

var errUnsupported = errors.New("conntrack: kernel connection tracking is only readable on Linux")

// Source is unavailable on this platform: Open returns an error.
type Source struct{}

// Open returns an error: conntrack is Linux only.
func Open(Config) (*Source, error) { return nil, errUnsupported }

// Close does nothing.
func (*Source) Close() error { return nil }

// Dump returns an error.
func (*Source) Dump(uint8, []connstore.Conn) ([]connstore.Conn, error) { return nil, errUnsupported }

// Listen returns an error.
func (*Source) Listen(context.Context, func([]connstore.Conn)) error { return errUnsupported }

// ListenReady returns an error.
func (*Source) ListenReady(context.Context, func([]connstore.Conn), func()) error {
	return errUnsupported
}

// Accounting returns an error.
func (*Source) Accounting() (Accounting, error) { return Accounting{}, errUnsupported }
