package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit are set at build time by the Makefile with
// -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = ""
)

func buildCommit() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

func runVersion(ctx context.Context, args []string) error {
	fs := newFlagSet("version", "", "Print the dualflow version, commit and Go version.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fmt.Printf("dualflow %s (commit %s, %s %s/%s)\n", version, buildCommit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
