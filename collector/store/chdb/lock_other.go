//go:build !unix

package chdb

// lockedBy is only implemented on Unix, where chDB runs.
func lockedBy(string) (bool, string) { return false, "" }
