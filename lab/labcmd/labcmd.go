// Package labcmd is the lab side of the dualflow binary: `dualflow lab`,
// `dualflow demo` (the product, package app and one exporter per lab node,
// next to a lab) and the demo's address for `dualflow trace`.
// cmd/dualflow hands them the binary's flag-set style and version; no
// product package imports the lab.
package labcmd

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dualflow/dualflow/lab"
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

// webURLFile, in a lab's state directory, holds the web URL of the demo
// running on it.
const webURLFile = "web-url"

// webTokenFile, in a lab's state directory, names the file of the demo's
// local operator token (its data directory's web-operator-token).
const webTokenFile = "web-token-file"

// DemoTokenFile returns the file of the operator token of the demo running
// on the lab of stateDir, or "".
func DemoTokenFile(stateDir string) string {
	b, err := os.ReadFile(filepath.Join(stateDir, webTokenFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// DemoWebURL returns the web URL of the demo running on the lab of
// stateDir.
func DemoWebURL(stateDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, webURLFile))
	if err != nil {
		return "", fmt.Errorf("no demo running on the lab of %s (start `dualflow demo`, or pass --server): %w", stateDir, err)
	}
	return strings.TrimSpace(string(b)), nil
}
