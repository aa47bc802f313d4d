//go:build !unix

package labcmd

import "os"

// tryLock cannot lock here: the demo (network namespaces) runs on Linux
// only.
func tryLock(*os.File) (held bool, err error) { return false, nil }
