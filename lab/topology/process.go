package topology

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Alive reports whether pid exists and is not a zombie.
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Field 3, after the parenthesised command name, is the state.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// PidFile returns the pid written in file if that process is alive and
// its command line (NUL-separated) contains every one of want, so that a
// stale pid file never names an unrelated process.
func PidFile(file string, want ...string) (int, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return 0, false
	}
	for _, w := range want {
		if !bytes.Contains(cmdline, []byte(w)) {
			return 0, false
		}
	}
	return pid, Alive(pid)
}

// Reap waits up to grace for pids to exit (the caller has asked them to),
// then sends SIGKILL to those still alive.
func Reap(pids []int, grace time.Duration) error {
	deadline := time.Now().Add(grace)
	for slices.ContainsFunc(pids, Alive) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var errs []error
	for _, p := range pids {
		if !Alive(p) {
			continue
		}
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill pid %d: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
