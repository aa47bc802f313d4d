package topology

import (
	"runtime"

	"github.com/vishvananda/netns"
)

// lockOSThread locks the calling goroutine to its thread for good: the
// thread changes namespace and must never run another goroutine.
func lockOSThread() { runtime.LockOSThread() }

func nsHandle(fd int) netns.NsHandle { return netns.NsHandle(fd) }
