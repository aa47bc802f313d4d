//go:build !linux

package lab

import "github.com/dualflow/dualflow/nsrun"

// Conntrack returns nsrun.ErrUnsupported: kernel conntrack of a namespace
// needs Linux.
func (l *Lab) Conntrack(node string) ([]Conn, error) { return nil, nsrun.ErrUnsupported }

// Counters returns nsrun.ErrUnsupported: nftables needs Linux.
func (l *Lab) Counters(node string) (map[string]Counter, error) { return nil, nsrun.ErrUnsupported }
