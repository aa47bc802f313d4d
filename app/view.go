package app

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
)

// view answers the web's questions about the cluster from the collector's
// live Kubernetes view (collector.Cluster), so every answer follows the
// cluster as it changes.
type view struct{ c *collector.Collector }

// cluster is the live cluster view; ErrUnavailable (503) while there is
// none.
func (v *view) cluster() (*enrich.Snapshot, error) {
	s, err := v.c.Cluster()
	if errors.Is(err, collector.ErrNoCluster) {
		return nil, fmt.Errorf("%w: %w", audit.ErrUnavailable, err)
	}
	return s, err
}

// service is a Service of the live view in reachability's terms.
func (v *view) service(namespace, name string) (*audit.ServiceSpec, bool) {
	e := v.c.Enricher()
	if e == nil {
		return nil, false
	}
	s, ok := e.Service(namespace, name)
	if !ok {
		return nil, false
	}
	return serviceSpec(s), true
}

// serviceSpec converts an enrichment Service: its families are those of
// spec.ipFamilies it has a ClusterIP of (headless: of spec.ipFamilies).
func serviceSpec(s *enrich.Service) *audit.ServiceSpec {
	out := &audit.ServiceSpec{Namespace: s.Namespace, Name: s.Name, Headless: s.Headless, Selector: s.Selector}
	for _, f := range []struct {
		v  uint8
		kf corev1.IPFamily
	}{{4, corev1.IPv4Protocol}, {6, corev1.IPv6Protocol}} {
		_, hasIP := enrich.AddrOfFamily(s.ClusterIPs, f.v)
		if s.HasFamily(f.kf) && (hasIP || s.Headless) {
			out.Families = append(out.Families, int(f.v))
		}
	}
	for _, sp := range s.Ports {
		if sp.Port <= 0 || sp.Port > 65535 {
			continue
		}
		p := audit.ServicePort{Name: sp.Name, Proto: policy.ProtoNumber(&sp.Protocol), Port: uint16(sp.Port)}
		switch {
		case sp.TargetPort.Type == intstr.String:
			p.TargetPortName = sp.TargetPort.StrVal
		case sp.TargetPort.IntVal > 0 && sp.TargetPort.IntVal <= 65535:
			p.TargetPort = uint16(sp.TargetPort.IntVal)
		}
		out.Ports = append(out.Ports, p)
	}
	return out
}
