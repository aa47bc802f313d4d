//go:build linux

package nsrun

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn in the network namespace at path (e.g. /run/netns/df-node-1)
// and returns its error. It blocks until fn returns. fn must not start
// goroutines that create sockets: they would run in the caller's namespace.
func Do(path string, fn func() error) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer unix.Close(fd)
	return OnThrowawayThread(func() error {
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns %s: %w", path, err)
		}
		return fn()
	})
}

// OnThrowawayThread runs fn on an OS thread of its own that is discarded
// when fn returns, so fn may change the thread's namespaces freely. The
// thread is never the main thread: the kernel shows the main thread's
// namespace as the process's (/proc/<pid>/ns/net), and Go never discards the
// main thread, so changing it would leave the whole process looking like it
// lives in the lab (and keep the namespace alive).
func OnThrowawayThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		if unix.Gettid() != unix.Getpid() {
			errc <- fn()
			return
		}
		// On the main thread: keep it pinned here, so the goroutine below
		// gets another thread, then give the main thread back untouched.
		inner := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			inner <- fn()
		}()
		err := <-inner
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Output runs argv in the network namespace at path, with stdin as the
// command's standard input (may be nil), and returns its combined output.
// The command is forked from a thread inside the namespace, so it runs there
// without `ip netns exec`.
func Output(ctx context.Context, path string, stdin []byte, argv ...string) ([]byte, error) {
	var out []byte
	err := Do(path, func() error {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin) // copied by a goroutine that cmd.Wait owns
		}
		var err error
		out, err = cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %w: %s", argv[0], err, out)
		}
		return nil
	})
	return out, err
}

// Start starts cmd inside the network namespace at path. The caller owns
// the process (Wait or Release it).
func Start(path string, cmd *exec.Cmd) error {
	return Do(path, cmd.Start)
}
