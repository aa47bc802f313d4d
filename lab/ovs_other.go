//go:build !linux

package lab

import (
	"context"

	"github.com/dualflow/dualflow/lab/ovs"
	"github.com/dualflow/dualflow/nsrun"
)

func (l *Lab) ovsEnv() (ovs.Env, error)            { return ovs.Env{}, nsrun.ErrUnsupported }
func (l *Lab) podsTxOff(ctx context.Context) error { return nsrun.ErrUnsupported }
func (l *Lab) fenceNode(ctx context.Context, node string, ports []ovs.Port) error {
	return nsrun.ErrUnsupported
}
