package audit

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/enrich"
)

// TestServiceSpec: a Service's families are those it has a ClusterIP of
// (headless: its ipFamilies); its ports keep numbered, named and unset
// target ports apart.
func TestServiceSpec(t *testing.T) {
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	ports := []enrich.ServicePort{
		{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http")},
		{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromInt32(9091)},
		{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
	}
	for _, tc := range []struct {
		name string
		svc  enrich.Service
		want []int
	}{
		{"IPv4 single-stack", enrich.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.12")}, IPFamilies: []corev1.IPFamily{v4}}, []int{4}},
		{"IPv6 single-stack", enrich.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:10:ff::12")}, IPFamilies: []corev1.IPFamily{v6}}, []int{6}},
		{"dual, IPv6 primary", enrich.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:10:ff::12"), netip.MustParseAddr("198.19.0.12")}, IPFamilies: []corev1.IPFamily{v6, v4}}, []int{4, 6}},
		{"dual families, one ClusterIP", enrich.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.12")}, IPFamilies: []corev1.IPFamily{v4, v6}}, []int{4}},
		{"headless IPv6", enrich.Service{Headless: true, IPFamilies: []corev1.IPFamily{v6}}, []int{6}},
		{"ExternalName", enrich.Service{Type: corev1.ServiceTypeExternalName}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.svc.Ports = ports
			got := ServiceSpecOf(&tc.svc)
			if !slices.Equal(got.Families, tc.want) {
				t.Errorf("families %v, want %v", got.Families, tc.want)
			}
			want := []ServicePort{{Name: "http", Proto: 6, Port: 80, TargetPortName: "http"}, {Name: "metrics", Proto: 6, Port: 9090, TargetPort: 9091}, {Name: "dns", Proto: 17, Port: 53}}
			if !slices.Equal(got.Ports, want) {
				t.Errorf("ports %+v, want %+v", got.Ports, want)
			}
		})
	}
}
