// Package inventory is dualflow's one reader of Kubernetes manifests: the
// enrichment's inventory mode (offline audits of a cluster dump, the local
// demo on the lab), the same view built from files by enrich.LoadSnapshot
// (dualflow audit --inventory, the correlator's --collector.inventory),
// what-if policies, and the lab's manifest (DecodeAll, which keeps every
// kind it can decode). A file holds multi-document YAML ("---"
// separated) or JSON, and any document may be a List
// (`kubectl get pods,svc,... -A -o yaml` writes one v1 List). The kinds
// enrichment uses are decoded with the API machinery's deserializer and
// checked (addresses and CIDRs must parse, names must be set, no object
// twice); other kinds are skipped and counted. Every error names the file, the line where the document
// starts, the document (and List item) and the object.
//
// The package only reads the files it is given; it is safe for concurrent
// use.
package inventory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"
)

// Kinds lists the kinds an inventory keeps (group/version, kind); others
// are skipped.
var Kinds = []schema.GroupVersionKind{
	corev1.SchemeGroupVersion.WithKind("Pod"),
	corev1.SchemeGroupVersion.WithKind("Service"),
	corev1.SchemeGroupVersion.WithKind("Node"),
	corev1.SchemeGroupVersion.WithKind("Namespace"),
	discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"),
	appsv1.SchemeGroupVersion.WithKind("ReplicaSet"),
	batchv1.SchemeGroupVersion.WithKind("Job"),
	networkingv1.SchemeGroupVersion.WithKind("NetworkPolicy"),
}

// decoder decodes the kinds of Kinds (built once, on first use).
var decoder = sync.OnceValues(func() (runtime.Decoder, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("inventory scheme: %w", err)
		}
	}
	return serializer.NewCodecFactory(s).UniversalDeserializer(), nil
})

// Location says where an object is: file, line of its document's first
// line of content, document number (1-based, empty documents not
// counted) and List item (1-based, 0 outside a List).
type Location struct {
	File      string
	Line      int
	Doc, Item int
}

func (l Location) String() string {
	s := fmt.Sprintf("%s:%d (document %d", l.File, l.Line, l.Doc)
	if l.Item > 0 {
		s += fmt.Sprintf(", list item %d", l.Item)
	}
	return s + ")"
}

// Object is a decoded object with where it came from.
type Object struct {
	runtime.Object
	Location
	Kind, Namespace, Name string
}

// Where describes the object for messages: file:line (document n) Kind ns/name.
func (o Object) Where() string {
	return o.Location.String() + " " + describe(o.Kind, o.Namespace, o.Name)
}

func describe(kind, ns, name string) string {
	switch {
	case kind == "":
		return "object"
	case name == "":
		return kind + " (no name)"
	case ns == "":
		return kind + " " + name
	}
	return kind + " " + ns + "/" + name
}

// Error is a malformed manifest: where, which object (as far as known)
// and what is wrong.
type Error struct {
	Location
	Kind, Namespace, Name string
	Err                   error
}

func (e *Error) Error() string {
	return fmt.Sprintf("inventory %s %s: %v", e.Location, describe(e.Kind, e.Namespace, e.Name), e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Result is what a load found.
type Result struct {
	Objects []Object
	// Skipped counts the objects of other kinds, by "apiVersion kind".
	Skipped map[string]int
}

// Load reads every file. Objects keep file order; one object (kind,
// namespace, name) given twice is an error naming both places.
func Load(files ...string) (*Result, error) {
	res := &Result{Skipped: map[string]int{}}
	seen := map[string]Location{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("inventory: %w", err)
		}
		if err := decodeInto(res, seen, f, b, false); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// Decode reads one manifest from r; name is used in errors.
func Decode(name string, r io.Reader) (*Result, error) { return decode(name, r, false) }

// DecodeAll is Decode keeping every kind of core/v1, apps/v1, batch/v1,
// discovery/v1 and networking/v1, not only Kinds; a kind outside them is
// an error. The lab reads its manifest (Deployments included) with it.
func DecodeAll(name string, r io.Reader) (*Result, error) { return decode(name, r, true) }

func decode(name string, r io.Reader, all bool) (*Result, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("inventory %s: %w", name, err)
	}
	res := &Result{Skipped: map[string]int{}}
	if err := decodeInto(res, map[string]Location{}, name, b, all); err != nil {
		return nil, err
	}
	return res, nil
}

// header is what is read of a document before decoding it.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// decodeInto decodes the documents of data into res, the objects of
// Kinds only unless all.
func decodeInto(res *Result, seen map[string]Location, file string, data []byte, all bool) error {
	n := 0
	for _, d := range splitDocuments(data) {
		n++
		loc := Location{File: file, Line: d.line, Doc: n}
		js, err := yaml.YAMLToJSON(d.data)
		if err != nil {
			return &Error{Location: loc, Err: fmt.Errorf("not YAML: %w", err)}
		}
		if err := decodeObject(res, seen, loc, js, all); err != nil {
			return err
		}
	}
	return nil
}

func decodeObject(res *Result, seen map[string]Location, loc Location, js []byte, all bool) error {
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return nil
	}
	var h header
	if err := json.Unmarshal(js, &h); err != nil {
		return &Error{Location: loc, Err: fmt.Errorf("not a Kubernetes object: %w", err)}
	}
	e := func(err error) error {
		return &Error{Location: loc, Kind: h.Kind, Namespace: h.Metadata.Namespace, Name: h.Metadata.Name, Err: err}
	}
	if h.Kind == "" || h.APIVersion == "" {
		return e(errors.New("missing apiVersion or kind"))
	}
	if h.Kind == "List" || (strings.HasSuffix(h.Kind, "List") && h.Items != nil) {
		if loc.Item > 0 {
			return e(errors.New("a List inside a List"))
		}
		for i, it := range h.Items {
			iloc := loc
			iloc.Item = i + 1
			if err := decodeObject(res, seen, iloc, it, all); err != nil {
				return err
			}
		}
		return nil
	}
	gv, err := schema.ParseGroupVersion(h.APIVersion)
	if err != nil {
		return e(fmt.Errorf("apiVersion %q: %w", h.APIVersion, err))
	}
	if !all && !slices.Contains(Kinds, gv.WithKind(h.Kind)) {
		res.Skipped[h.APIVersion+" "+h.Kind]++
		return nil
	}
	dec, err := decoder()
	if err != nil {
		return err
	}
	obj, _, err := dec.Decode(js, nil, nil)
	if err != nil {
		return e(fmt.Errorf("decode: %w", err))
	}
	o := Object{Object: obj, Location: loc, Kind: h.Kind, Namespace: h.Metadata.Namespace, Name: h.Metadata.Name}
	if err := check(&o); err != nil {
		return &Error{Location: loc, Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, Err: err}
	}
	key := o.Kind + " " + o.Namespace + "/" + o.Name
	if prev, dup := seen[key]; dup {
		return e(fmt.Errorf("given twice, first at %s", prev))
	}
	seen[key] = loc
	res.Objects = append(res.Objects, o)
	return nil
}

// check validates what the enrichment reads and defaults the namespace
// of namespaced objects to "default", as kubectl does.
func check(o *Object) error {
	type meta interface {
		GetName() string
		GetNamespace() string
		SetNamespace(string)
	}
	m, ok := o.Object.(meta)
	if !ok {
		return fmt.Errorf("%T has no metadata", o.Object)
	}
	if m.GetName() == "" {
		return errors.New("metadata.name is empty")
	}
	switch o.Kind {
	case "Node", "Namespace":
		if m.GetNamespace() != "" {
			return fmt.Errorf("metadata.namespace %q on a cluster-scoped %s", m.GetNamespace(), o.Kind)
		}
	default:
		if m.GetNamespace() == "" {
			m.SetNamespace(corev1.NamespaceDefault)
		}
	}
	o.Namespace = m.GetNamespace()
	var errs []error
	ip := func(field, s string) {
		if _, err := netip.ParseAddr(s); err != nil {
			errs = append(errs, fmt.Errorf("%s: invalid IP %q", field, s))
		}
	}
	cidr := func(field, s string) {
		if _, err := netip.ParsePrefix(s); err != nil {
			errs = append(errs, fmt.Errorf("%s: invalid CIDR %q", field, s))
		}
	}
	switch v := o.Object.(type) {
	case *corev1.Pod:
		if v.Status.PodIP != "" {
			ip("status.podIP", v.Status.PodIP)
		}
		for i, a := range v.Status.PodIPs {
			ip(fmt.Sprintf("status.podIPs[%d].ip", i), a.IP)
		}
	case *corev1.Service:
		for i, a := range v.Spec.ClusterIPs {
			if a != corev1.ClusterIPNone {
				ip(fmt.Sprintf("spec.clusterIPs[%d]", i), a)
			}
		}
		if a := v.Spec.ClusterIP; a != "" && a != corev1.ClusterIPNone {
			ip("spec.clusterIP", a)
		}
		for i, a := range v.Spec.ExternalIPs {
			ip(fmt.Sprintf("spec.externalIPs[%d]", i), a)
		}
		for i, in := range v.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				ip(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), in.IP)
			}
		}
	case *discoveryv1.EndpointSlice:
		switch v.AddressType {
		case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
			for i, ep := range v.Endpoints {
				for j, s := range ep.Addresses {
					field := fmt.Sprintf("endpoints[%d].addresses[%d]", i, j)
					a, err := netip.ParseAddr(s)
					if err != nil {
						errs = append(errs, fmt.Errorf("%s: invalid IP %q", field, s))
					} else if a.Unmap().Is6() != (v.AddressType == discoveryv1.AddressTypeIPv6) {
						errs = append(errs, fmt.Errorf("%s: %s in a slice of addressType %s", field, s, v.AddressType))
					}
				}
			}
		case discoveryv1.AddressTypeFQDN:
		default:
			errs = append(errs, fmt.Errorf("addressType %q: want IPv4, IPv6 or FQDN", v.AddressType))
		}
	case *corev1.Node:
		for i, a := range v.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				ip(fmt.Sprintf("status.addresses[%d].address", i), a.Address)
			}
		}
		if v.Spec.PodCIDR != "" {
			cidr("spec.podCIDR", v.Spec.PodCIDR)
		}
		for i, c := range v.Spec.PodCIDRs {
			cidr(fmt.Sprintf("spec.podCIDRs[%d]", i), c)
		}
	case *networkingv1.NetworkPolicy:
		peers := func(dir string, i int, ps []networkingv1.NetworkPolicyPeer) {
			for j, p := range ps {
				if b := p.IPBlock; b != nil {
					field := fmt.Sprintf("spec.%s[%d].%s[%d].ipBlock", dir, i, map[string]string{"ingress": "from", "egress": "to"}[dir], j)
					cidr(field+".cidr", b.CIDR)
					for k, x := range b.Except {
						cidr(fmt.Sprintf("%s.except[%d]", field, k), x)
					}
				}
			}
		}
		for i, r := range v.Spec.Ingress {
			peers("ingress", i, r.From)
		}
		for i, r := range v.Spec.Egress {
			peers("egress", i, r.To)
		}
	}
	return errors.Join(errs...)
}

type document struct {
	line int // 1-based line of the first line of content
	data []byte
}

// splitDocuments splits a YAML stream at "---" lines, keeping the line
// where each document's content starts. Documents with nothing but blank
// lines and comments are dropped. A JSON file is one document.
func splitDocuments(data []byte) []document {
	var out []document
	var cur []byte
	first := 0 // line of the first content line of cur, 0 while none
	line := 0
	flush := func() {
		if first > 0 {
			out = append(out, document{line: first, data: cur})
		}
		cur, first = nil, 0
	}
	for len(data) > 0 {
		line++
		l := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i+1], data[i+1:]
		} else {
			data = nil
		}
		t := bytes.TrimRight(l, "\r\n")
		if bytes.HasPrefix(t, []byte("---")) && (len(t) == 3 || t[3] == ' ' || t[3] == '\t' || t[3] == '#') {
			flush()
			continue
		}
		if first == 0 {
			if s := bytes.TrimSpace(t); len(s) == 0 || s[0] == '#' {
				continue
			}
			first = line
		}
		cur = append(cur, l...)
	}
	flush()
	return out
}
