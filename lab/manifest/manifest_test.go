package manifest

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

var (
	labV4 = netip.MustParsePrefix("198.18.0.0/15")
	labV6 = netip.MustParsePrefix("fd00:10::/32")
)

func inLab(t *testing.T, what, s string) {
	t.Helper()
	var a netip.Addr
	if p, err := netip.ParsePrefix(s); err == nil {
		a = p.Addr()
	} else if a, err = netip.ParseAddr(s); err != nil {
		t.Errorf("%s: %q is not an address", what, s)
		return
	}
	if !labV4.Contains(a) && !labV6.Contains(a) {
		t.Errorf("%s: %s outside 198.18.0.0/15 and fd00:10::/32", what, a)
	}
}

func TestGenerate(t *testing.T) {
	tests := []struct {
		mode     Mode
		families []corev1.IPFamily
	}{
		{ModeIPv4, []corev1.IPFamily{corev1.IPv4Protocol}},
		{ModeIPv6, []corev1.IPFamily{corev1.IPv6Protocol}},
		{ModeDual, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode), func(t *testing.T) {
			m, err := Generate(Spec{Mode: tc.mode, Nodes: 2, Prefix: "dft-"})
			if err != nil {
				t.Fatal(err)
			}
			if m.Mode() != tc.mode {
				t.Errorf("Mode() = %s", m.Mode())
			}
			zones := map[string]bool{}
			for _, n := range m.Nodes {
				zones[n.Labels[LabelZone]] = true
				if len(n.Spec.PodCIDRs) != len(tc.families) {
					t.Errorf("node %s podCIDRs %v", n.Name, n.Spec.PodCIDRs)
				}
				for _, c := range n.Spec.PodCIDRs {
					inLab(t, "pod CIDR", c)
				}
				for _, f := range tc.families {
					a, ok := NodeAddr(&n, f)
					if !ok {
						t.Errorf("node %s: no %s InternalIP", n.Name, f)
					}
					inLab(t, "node IP", a.String())
				}
				if !strings.HasPrefix(n.Annotations[AnnotationNetNS], "dft-") {
					t.Errorf("node netns %q", n.Annotations[AnnotationNetNS])
				}
			}
			if len(zones) != 2 {
				t.Errorf("want two zones, got %v", zones)
			}
			for _, p := range m.Pods {
				if len(p.Status.PodIPs) != len(tc.families) {
					t.Errorf("pod %s: podIPs %v", p.Name, p.Status.PodIPs)
				}
				for i, ip := range p.Status.PodIPs {
					inLab(t, "pod IP", ip.IP)
					a := netip.MustParseAddr(ip.IP)
					if FamilyOf(a) != tc.families[i] {
						t.Errorf("pod %s: podIPs[%d] = %s, want family %s", p.Name, i, a, tc.families[i])
					}
					n, _ := m.Node(p.Spec.NodeName)
					if cidr, _ := NodePodCIDR(n, FamilyOf(a)); !cidr.Contains(a) {
						t.Errorf("pod %s: %s outside node pod CIDR %s", p.Name, a, cidr)
					}
				}
				// What a 1.35+ API server's PodTopologyLabels admission
				// copies from the node (issue 24).
				if n, _ := m.Node(p.Spec.NodeName); n == nil || p.Labels[LabelZone] != n.Labels[LabelZone] || p.Labels[LabelRegion] != n.Labels[LabelRegion] || p.Labels[LabelZone] == "" || p.Labels[LabelRegion] == "" {
					t.Errorf("pod %s: topology labels %v, want its node's", p.Name, p.Labels)
				}
				if n := len(HostIface(p.Namespace, p.Name)); n > 15 {
					t.Errorf("host iface name of %d bytes", n)
				}
			}
			owned := 0
			for _, p := range m.Pods {
				if len(p.OwnerReferences) > 0 {
					owned++
					if p.OwnerReferences[0].Kind != "ReplicaSet" {
						t.Errorf("pod %s owner %v", p.Name, p.OwnerReferences)
					}
				}
			}
			if owned == 0 || owned == len(m.Pods) {
				t.Errorf("want some (not all) pods owned by ReplicaSets, got %d of %d", owned, len(m.Pods))
			}
			for _, s := range m.Services {
				for _, ip := range s.Spec.ClusterIPs {
					inLab(t, "cluster IP", ip)
				}
				if len(s.Spec.ClusterIPs) != len(s.Spec.IPFamilies) {
					t.Errorf("service %s: clusterIPs %v vs families %v", s.Name, s.Spec.ClusterIPs, s.Spec.IPFamilies)
				}
				var slices []discoveryv1.EndpointSlice
				for _, sl := range m.EndpointSlices {
					if sl.Namespace == s.Namespace && sl.Labels[LabelServiceName] == s.Name {
						slices = append(slices, sl)
					}
				}
				if len(slices) != len(s.Spec.IPFamilies) {
					t.Errorf("service %s: %d EndpointSlices for families %v", s.Name, len(slices), s.Spec.IPFamilies)
				}
				for _, sl := range slices {
					for _, ep := range sl.Endpoints {
						if ep.NodeName == nil || ep.Zone == nil || *ep.Zone == "" {
							t.Errorf("slice %s: endpoint without node or zone", sl.Name)
						}
					}
				}
			}
			if tc.mode == ModeDual {
				web, _ := m.Service(NSFrontend, ServiceWeb)
				if *web.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyRequireDualStack || len(web.Spec.ClusterIPs) != 2 {
					t.Errorf("web service: %v %v", *web.Spec.IPFamilyPolicy, web.Spec.ClusterIPs)
				}
				single, _ := m.Service(NSBackend, ServiceAPISingle)
				if _, ok := ServiceAddr(single, corev1.IPv6Protocol); ok {
					t.Error("api-single has an IPv6 ClusterIP in dual mode")
				}
			}
		})
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, mode := range Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, err := Generate(Spec{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			var a bytes.Buffer
			if err := m.Encode(&a); err != nil {
				t.Fatal(err)
			}
			back, err := Decode(bytes.NewReader(a.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(back.Objects()), len(m.Objects()); got != want {
				t.Fatalf("decoded %d objects, want %d", got, want)
			}
			var b bytes.Buffer
			if err := back.Encode(&b); err != nil {
				t.Fatal(err)
			}
			if a.String() != b.String() {
				t.Errorf("round trip changed the manifest")
			}
			if !strings.Contains(a.String(), "apiVersion: discovery.k8s.io/v1") || !strings.Contains(a.String(), "kind: NetworkPolicy") {
				t.Errorf("manifest lacks apiVersion/kind lines")
			}
		})
	}
}

func TestDecodeList(t *testing.T) {
	const list = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: a}
- apiVersion: v1
  kind: Pod
  metadata: {name: p, namespace: a}
  status:
    podIPs: [{ip: "fd00:10:0:1::10"}, {ip: "198.18.1.10"}]
`
	m, err := Decode(strings.NewReader(list))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Namespaces) != 1 || len(m.Pods) != 1 {
		t.Fatalf("got %d namespaces, %d pods", len(m.Namespaces), len(m.Pods))
	}
	got := PodAddrs(&m.Pods[0])
	want := []netip.Addr{netip.MustParseAddr("fd00:10:0:1::10"), netip.MustParseAddr("198.18.1.10")}
	if !slices.Equal(got, want) {
		t.Errorf("PodAddrs = %v, want %v", got, want)
	}
	if m.Mode() != ModeDual {
		t.Errorf("Mode() = %s, want dual", m.Mode())
	}
}

func TestDecodeUnknownKind(t *testing.T) {
	_, err := Decode(strings.NewReader("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"))
	if err == nil {
		t.Fatal("want an error for an unsupported kind")
	}
}

func TestSpecValidate(t *testing.T) {
	for _, s := range []Spec{{Mode: "ipv5", Nodes: 2, Prefix: "x-"}, {Mode: ModeDual, Nodes: 0, Prefix: "x-"}, {Mode: ModeDual, Nodes: MaxNodes + 1, Prefix: "x-"}} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v: want error", s)
		}
	}
}

func FuzzDecode(f *testing.F) {
	m, _ := Generate(Spec{})
	var b bytes.Buffer
	m.Encode(&b)
	f.Add(b.Bytes())
	f.Add([]byte("apiVersion: v1\nkind: List\nitems: []\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		Decode(bytes.NewReader(data)) // must not panic
	})
}
