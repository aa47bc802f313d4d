//go:build !linux

package labtruth

import (
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/nsrun"
)

// Conntrack returns nsrun.ErrUnsupported: kernel conntrack of a namespace
// needs Linux.
func Conntrack(l *lab.Lab, node string) ([]Conn, error) { return nil, nsrun.ErrUnsupported }

// Counters returns nsrun.ErrUnsupported: nftables needs Linux.
func Counters(l *lab.Lab, node string) (map[string]Counter, error) { return nil, nsrun.ErrUnsupported }
