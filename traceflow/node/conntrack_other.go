//go:build !linux

package node

import (
	"net/netip"

	"github.com/dualflow/dualflow/traceflow"
)

type ctView struct {
	DstNAT, SrcNAT netip.AddrPort
	Text           string
}

func (t *Tracer) conntrackOf(traceflow.Probe) (ctView, bool) { return ctView{}, false }
