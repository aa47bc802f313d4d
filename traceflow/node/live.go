package node

import (
	"context"
	"fmt"

	"github.com/dualflow/dualflow/traceflow"
)

func (t *Tracer) watchLive(ctx context.Context, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error {
	return fmt.Errorf("live traffic: %w", traceflow.ErrNotSupported)
}
