//go:build !linux

package nsrun

import (
	"context"
	"os/exec"
)

// Do returns ErrUnsupported.
func Do(path string, fn func() error) error { return ErrUnsupported }

// OnThrowawayThread returns ErrUnsupported.
func OnThrowawayThread(fn func() error) error { return ErrUnsupported }

// Output returns ErrUnsupported.
func Output(ctx context.Context, path string, stdin []byte, argv ...string) ([]byte, error) {
	return nil, ErrUnsupported
}

// Start returns ErrUnsupported.
func Start(path string, cmd *exec.Cmd) error { return ErrUnsupported }
