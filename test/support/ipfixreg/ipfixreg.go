// Package ipfixreg fills go-ipfix's element registry for tests that run
// go-ipfix's own collecting process (or check our elements against the
// registry). It imports only flow/ipfix, so the internal tests of the
// collector's decoder can use it.
package ipfixreg

import (
	"fmt"
	"sync"

	"github.com/vmware/go-ipfix/pkg/registry"

	"github.com/dualflow/dualflow/flow/ipfix"
)

// Register loads go-ipfix's IANA and Antrea registries and adds the dualflow
// elements (those of ipfix.EnterpriseDualflow in the templates), so a go-ipfix
// collecting process in strict decoding mode accepts our templates and
// decodes every element with its type. It is idempotent and safe for
// concurrent use. Call it instead of registry.LoadRegistry: LoadRegistry
// resets the registry and would drop the dualflow elements.
var Register = sync.OnceValue(func() error {
	registry.LoadRegistry()
	if err := registry.InitNewRegistry(ipfix.EnterpriseDualflow); err != nil {
		return fmt.Errorf("ipfix register: %w", err)
	}
	for _, e := range ipfix.Elements(4) {
		if e.Enterprise != ipfix.EnterpriseDualflow {
			continue
		}
		if err := registry.PutInfoElement(*e.InfoElement(), ipfix.EnterpriseDualflow); err != nil {
			return fmt.Errorf("ipfix register %s: %w", e.Name, err)
		}
	}
	return nil
})
