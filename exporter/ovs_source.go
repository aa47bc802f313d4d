package exporter

import (
	"context"
	"errors"

	"github.com/dualflow/dualflow/exporter/conntrack"
	"github.com/dualflow/dualflow/exporter/ovs"
	"github.com/dualflow/dualflow/flow"
)

// deniedSource is a source that also reports denied connections as
// finished records (the OVS source's drop packet-ins); Run posts them as
// they come, beside the store's records.
type deniedSource interface {
	Denied(ctx context.Context, fn func([]flow.Record)) error
}

// ovsSource adapts exporter/ovs to the exporter's source: it has no
// conntrack sysctls (Run does not check them for Source "ovs").
type ovsSource struct{ *ovs.Source }

func (ovsSource) Accounting() (conntrack.Accounting, error) {
	return conntrack.Accounting{}, errors.New("the ovs source has no conntrack sysctls")
}

var (
	_ source       = ovsSource{}
	_ deniedSource = ovsSource{}
)
