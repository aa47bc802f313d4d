// Package labcmd is the lab side of the dualflow binary: `dualflow lab`,
// `dualflow demo` (the product of package app, next to a lab, the lab's
// exporters and its node tracer) and the in-lab mode of `dualflow trace`.
// cmd/dualflow hands them the binary's flag-set style and version; no
// product package imports the lab.
package labcmd

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/tracer"
	"github.com/dualflow/dualflow/traceflow"
)

// DefaultStateDir is where a running lab keeps its state.
const DefaultStateDir = lab.DefaultStateDir

// Commands runs the lab commands of the binary.
type Commands struct {
	// Version is recorded with the demo's schema migrations.
	Version string
	// NewFlagSet returns a subcommand's flag set whose --help prints the
	// synopsis, help and flags (the binary's own style).
	NewFlagSet func(name, synopsis, help string) *flag.FlagSet
}

// Trace runs req in the running lab of stateDir, resolving names in its
// manifest or in the manifest file inventory.
func (lc *Commands) Trace(ctx context.Context, req traceflow.Request, stateDir, inventory string) (traceflow.Result, error) {
	l, err := lab.Open(stateDir, lab.Config{})
	if err != nil {
		return traceflow.Result{}, err
	}
	inv := tracer.Inventory{M: l.Manifest}
	if inventory != "" {
		f, err := os.Open(inventory)
		if err != nil {
			return traceflow.Result{}, fmt.Errorf("inventory: %w", err)
		}
		m, err := manifest.Decode(f)
		f.Close()
		if err != nil {
			return traceflow.Result{}, fmt.Errorf("inventory: %w", err)
		}
		inv.M = m
	}
	tr, err := tracer.NewTracer(l, inv)
	if err != nil {
		return traceflow.Result{}, err
	}
	c := traceflow.New(traceflow.Config{MaxTimeout: time.Hour}, tr, inv, nil)
	defer c.Close()
	return c.Trace(ctx, req)
}
