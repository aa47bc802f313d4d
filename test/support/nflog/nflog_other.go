//go:build !linux

package nflog

import (
	"errors"
	"time"
)

var errUnsupported = errors.New("nflog needs Linux")

// Reader receives the packets of one NFLOG group (Linux only).
type Reader struct{}

// Open returns an error: NFLOG exists on Linux only.
func Open(netnsPath string, group uint16) (*Reader, error) { return nil, errUnsupported }

// Read returns an error.
func (r *Reader) Read(deadline time.Time) ([]Packet, error) { return nil, errUnsupported }

// Close does nothing.
func (r *Reader) Close() error { return nil }
