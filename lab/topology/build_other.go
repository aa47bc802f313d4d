//go:build !linux

package topology

import (
	"context"
	"time"

	"github.com/dualflow/dualflow/nsrun"
)

// Build returns nsrun.ErrUnsupported.
func Build(ctx context.Context, spec *Spec) error { return nsrun.ErrUnsupported }

// Destroy returns nsrun.ErrUnsupported.
func Destroy(prefix string, grace time.Duration) error { return nsrun.ErrUnsupported }

func DeleteNS(name string) error { return nsrun.ErrUnsupported }
