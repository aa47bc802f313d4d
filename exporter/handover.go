package exporter

import (
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/internal/atomicfile"
)

// handoverVersion is the format of the handover file; a file of another
// version is ignored (logged), never misread.
const handoverVersion = 1

// handover is what a stopping exporter leaves for the next run on its node
// (in --exporter.state-dir, a hostPath that outlives the pod): every
// connection it exported, with the counters exported so far. The next run
// resumes from it, so that its first dumps, which still show those
// connections (TCP keeps them two minutes in TIME_WAIT), export none of
// them again: without it a DaemonSet roll exported every recent
// connection twice (the real-cluster tier's churn found it).
type handover struct {
	Version int
	Node    string // the node and netns it was written for
	NetNS   string
	Written time.Time
	Marks   []connstore.Mark
}

// handoverFile is this node's handover file in the state directory (one
// per node: nodes may share the directory).
func (e *Exporter) handoverFile() string {
	return filepath.Join(e.cfg.StateDir, "handover-"+e.cfg.NodeName)
}

// handoverMaxAge bounds the age of a file worth reading: conntrack keeps
// closed TCP connections 2 minutes, and a mark only matches a connection
// with the same conntrack id and start time anyway.
const handoverMaxAge = 10 * time.Minute

// readHandover reads and removes the handover file (a file is taken over
// once). A missing file is no handover; a file of another node, netns or
// format version, too old, or unreadable is ignored with the reason.
func readHandover(path, node, netns string, now time.Time) ([]connstore.Mark, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("handover file: %w", err)
	}
	defer os.Remove(path)
	defer f.Close()
	var h handover
	if err := gob.NewDecoder(f).Decode(&h); err != nil {
		return nil, fmt.Errorf("handover file %s: unreadable: %w", path, err)
	}
	switch {
	case h.Version != handoverVersion:
		return nil, fmt.Errorf("handover file %s: format %d, this exporter reads %d", path, h.Version, handoverVersion)
	case h.Node != node || h.NetNS != netns:
		return nil, fmt.Errorf("handover file %s: written for node %q netns %q, this is node %q netns %q", path, h.Node, h.NetNS, node, netns)
	case now.Sub(h.Written) > handoverMaxAge:
		return nil, fmt.Errorf("handover file %s: written %s ago, older than %s", path, now.Sub(h.Written).Round(time.Second), handoverMaxAge)
	}
	return h.Marks, nil
}

// writeHandover writes the handover file atomically (a crash leaves the
// old file or none, never half of one), readable by root only.
func writeHandover(path, node, netns string, marks []connstore.Mark, now time.Time) error {
	err := atomicfile.Write(path, 0o600, func(w io.Writer) error {
		return gob.NewEncoder(w).Encode(handover{Version: handoverVersion, Node: node, NetNS: netns, Written: now, Marks: marks})
	})
	if err != nil {
		return fmt.Errorf("handover file %s: %w", path, err)
	}
	return nil
}
