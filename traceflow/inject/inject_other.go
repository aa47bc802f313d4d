//go:build !linux

package inject

import (
	"context"
	"net"
)

// Send returns ErrUnsupported.
func Send(nsPath, iface string, frame []byte) error { return ErrUnsupported }

// InterfaceMAC returns ErrUnsupported.
func InterfaceMAC(nsPath, iface string) (net.HardwareAddr, error) { return nil, ErrUnsupported }

// Capture is not available on this system.
type Capture struct{}

// Listen returns ErrUnsupported.
func Listen(nsPath, iface string) (*Capture, error) { return nil, ErrUnsupported }

// Next returns ErrUnsupported.
func (c *Capture) Next(ctx context.Context) ([]byte, error) { return nil, ErrUnsupported }

// Close does nothing.
func (c *Capture) Close() error { return nil }
