package conntrack

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// inNetNS runs fn on an OS thread of its own that has joined the network
// namespace nsFD, and blocks until fn returns. The thread is discarded
// afterwards (its goroutine exits locked), so no other goroutine ever runs
// in the wrong namespace. Reading /proc/sys/net there shows that
// namespace's sysctls. Go never discards the main thread, so fn never runs
// on it: the kernel reports the main thread's namespace as the process's.
func inNetNS(nsFD int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		if unix.Gettid() == unix.Getpid() {
			// On the main thread: keep it pinned here so the inner goroutine
			// gets another thread, then hand the main thread back untouched.
			inner := make(chan error, 1)
			go func() {
				runtime.LockOSThread()
				inner <- setnsAndRun(nsFD, fn)
			}()
			err := <-inner
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		errc <- setnsAndRun(nsFD, fn)
	}()
	return <-errc
}

func setnsAndRun(nsFD int, fn func() error) error {
	if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	return fn()
}
