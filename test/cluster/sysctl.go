package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// kubeletSysctls are the machine-wide settings kubelet writes when it
// starts (pkg/kubelet/cm setupKernelTunables): not per network namespace,
// so they are the host's, and the cluster puts them back.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// sysctlLedger holds the host's values while kubelets start, and the
// clusters starting: a second cluster that starts while the first one's
// kubelets have changed the values restores the first's saved ones, not
// what it reads.
var sysctlLedger = "/run/dualflow/k8s-sysctls.json"

type ledger struct {
	Values  map[string]string `json:"values"`
	Holders []string          `json:"holders"`
}

// withLedger runs fn on the ledger under an exclusive lock.
func withLedger(fn func(l *ledger) error) error {
	if err := os.MkdirAll(filepath.Dir(sysctlLedger), 0o755); err != nil {
		return err
	}
	lf, err := os.OpenFile(sysctlLedger+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	var l ledger
	b, err := os.ReadFile(sysctlLedger)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &l); err != nil {
			return fmt.Errorf("%s: %w", sysctlLedger, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := fn(&l); err != nil {
		return err
	}
	if len(l.Holders) == 0 {
		if err := os.Remove(sysctlLedger); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	b, _ = json.Marshal(l)
	return os.WriteFile(sysctlLedger, b, 0o600)
}

// enterSysctls records the host's values (unless a cluster that is
// starting did already) before prefix's kubelets start.
func enterSysctls(prefix string) error {
	return withLedger(func(l *ledger) error {
		if l.Values == nil {
			l.Values = map[string]string{}
			for _, k := range kubeletSysctls {
				b, err := os.ReadFile("/proc/sys/" + k)
				if err != nil {
					return err
				}
				l.Values[k] = strings.TrimSpace(string(b))
			}
		}
		if !slices.Contains(l.Holders, prefix) {
			l.Holders = append(l.Holders, prefix)
		}
		return nil
	})
}

// leaveSysctls writes the recorded values back, once prefix's kubelets
// have started (or the cluster is gone). It does nothing when prefix holds
// no record.
func leaveSysctls(prefix string) error {
	return withLedger(func(l *ledger) error {
		i := slices.Index(l.Holders, prefix)
		if i < 0 {
			return nil
		}
		for k, v := range l.Values {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return fmt.Errorf("restore %s: %w", k, err)
			}
		}
		l.Holders = slices.Delete(l.Holders, i, i+1)
		return nil
	})
}
