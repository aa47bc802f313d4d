package observe

import (
	"bufio"
	"errors"
	"fmt"
	"os/exec"
	"sync"

	"github.com/dualflow/dualflow/nsrun"
)

// monitorBuffer is how many lines a Monitor holds for a slow reader; when
// it is full the reading goroutine blocks (nft then blocks on its pipe and
// the kernel drops trace events it cannot deliver, which ends as a timeout).
const monitorBuffer = 1024

// Monitor runs `nft monitor` inside one node's network namespace and
// delivers its output lines. Close it when done.
type Monitor struct {
	cmd   *exec.Cmd
	lines chan string
	quit  chan struct{}
	wg    sync.WaitGroup
}

// StartMonitor starts `nft monitor` (every event: ruleset changes and
// traces) in the namespace at nsPath, with nft at nftBin.
func StartMonitor(nsPath, nftBin string) (*Monitor, error) {
	cmd := exec.Command(nftBin, "monitor")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("nft monitor: %w", err)
	}
	if err := nsrun.Start(nsPath, cmd); err != nil {
		return nil, fmt.Errorf("nft monitor in %s: %w", nsPath, err)
	}
	m := &Monitor{cmd: cmd, lines: make(chan string, monitorBuffer), quit: make(chan struct{})}
	m.wg.Go(func() {
		defer close(m.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case m.lines <- sc.Text():
			case <-m.quit:
				return
			}
		}
	})
	return m, nil
}

// Lines returns the output lines; the channel closes when nft exits.
func (m *Monitor) Lines() <-chan string { return m.lines }

// Close stops nft and waits for it and the reading goroutine.
func (m *Monitor) Close() error {
	close(m.quit)
	if m.cmd.Process != nil {
		m.cmd.Process.Kill()
	}
	m.wg.Wait() // the pipe reaches EOF once nft is gone
	err := m.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return nil // killed
	}
	return err
}
