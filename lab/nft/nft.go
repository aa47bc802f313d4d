// Package nft translates a lab manifest into the nftables ruleset one node
// enforces: ClusterIP DNAT for every Service (like kube-proxy's nftables
// mode) and the NetworkPolicies of the pods hosted on the node (ingress for
// local destination pods, egress for local source pods, like real CNIs).
//
// Render is a pure function from manifest objects to `nft -f` input. Every
// NetworkPolicy rule is identifiable in the kernel: each nft rule generated
// from rule i of policy ns/name in direction d updates the named counter
// "ns/name/d/i" (see RuleName) and carries the same text as its comment.
// Drops of an isolated pod go through one rule per pod and direction that
// updates counter "drop/d/ns/pod" (see DropName) and logs to NFLOG with that
// name as prefix.
package nft

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/dualflow/dualflow/lab/manifest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

// Defaults of Options.
const (
	DefaultTable = "dualflow"
	// DefaultLogGroup is the NFLOG group that drops are logged to.
	DefaultLogGroup = 100
)

// Options tune the generated ruleset.
type Options struct {
	// Table is the name of the inet table (default "dualflow").
	Table string
	// LogGroup is the NFLOG group of drop rules (default 100).
	LogGroup uint16
}

// SetDefaults fills in unset fields.
func (o *Options) SetDefaults() {
	o.Table = cmp.Or(o.Table, DefaultTable)
	o.LogGroup = cmp.Or(o.LogGroup, DefaultLogGroup)
}

// Direction is a NetworkPolicy direction.
type Direction string

// The two policy directions, spelled as in counter names.
const (
	Ingress Direction = "ingress"
	Egress  Direction = "egress"
)

// RuleName returns the counter name and comment of rule i (0-based, in
// spec order) of policy namespace/name in direction d: "ns/name/ingress/0".
func RuleName(namespace, name string, d Direction, i int) string {
	return ident(namespace + "/" + name + "/" + string(d) + "/" + strconv.Itoa(i))
}

// DropName returns the counter name (and NFLOG prefix) of the drop rule of
// pod namespace/name in direction d: "drop/ingress/ns/pod".
func DropName(d Direction, namespace, name string) string {
	return ident("drop/" + string(d) + "/" + namespace + "/" + name)
}

// maxName is NFT_NAME_MAXLEN (256) minus the terminating NUL.
const maxName = 255

// ident makes s a valid unquoted nft identifier, which is what nft 1.0.x
// accepts as a chain or object name: it must start with a letter, '_' or
// '.', and continue with letters, digits, '/', '-', '_' or '.'.
// Kubernetes names only fail the first rule (a namespace may start with a
// digit): such names get a '_' prefix. Names over 255 bytes are cut and end
// in a hash, so they stay unique.
func ident(s string) string {
	b := []byte(s)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '-' || c == '_' || c == '.'
		if !ok {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] >= '0' && b[0] <= '9' || b[0] == '/' || b[0] == '-' {
		b = append([]byte{'_'}, b...)
	}
	if len(b) > maxName {
		h := sha256.Sum256([]byte(s))
		b = append(b[:maxName-9], '-')
		b = append(b, hex.EncodeToString(h[:4])...)
	}
	return string(b)
}

// family is one IP family as nft spells it.
type family struct {
	l3     string // payload keyword: ip or ip6
	nfp    string // meta nfproto value
	k8s    corev1.IPFamily
	suffix string // chain name suffix
}

var (
	fam4     = family{"ip", "ipv4", corev1.IPv4Protocol, "v4"}
	fam6     = family{"ip6", "ipv6", corev1.IPv6Protocol, "v6"}
	families = []family{fam4, fam6}
)

func familyOf(a netip.Addr) family {
	if a.Is4() || a.Is4In6() {
		return fam4
	}
	return fam6
}

// Render returns the ruleset of node as `nft -f` input. The text replaces
// the whole table atomically (it creates, deletes and redefines it), so it
// can be applied again after the manifest changes.
func Render(m *manifest.Manifest, node string, opts Options) (string, error) {
	opts.SetDefaults()
	r, err := newRenderer(m, node, opts)
	if err != nil {
		return "", fmt.Errorf("render ruleset: %w", err)
	}
	if err := r.services(); err != nil {
		return "", err
	}
	if err := r.policies(); err != nil {
		return "", err
	}
	return r.text(), nil
}

type chain struct {
	name  string
	head  string // base chain declaration, empty for regular chains
	rules []string
}

type renderer struct {
	m        *manifest.Manifest
	node     string
	opts     Options
	nsLabels map[string]labels.Set

	counters  []string // named counters, declared first
	nat       chain    // prerouting DNAT
	noEP      []string // forward rules rejecting services without endpoints
	dispatchE []string // iifname map entries: host iface -> egress chain
	dispatchI []string // oifname map entries: host iface -> ingress chain
	chains    []chain  // regular chains
}

// newRenderer starts the rendering of node's rules.
func newRenderer(m *manifest.Manifest, node string, opts Options) (*renderer, error) {
	if _, ok := m.Node(node); !ok {
		return nil, fmt.Errorf("node %q not in manifest", node)
	}
	r := &renderer{m: m, node: node, opts: opts, nsLabels: map[string]labels.Set{}}
	for _, ns := range m.Namespaces {
		r.nsLabels[ns.Name] = labels.Set(ns.Labels)
	}
	return r, nil
}

func (r *renderer) text() string {
	var b strings.Builder
	t := "inet " + r.opts.Table
	fmt.Fprintf(&b, "# dualflow lab ruleset of node %s. Generated by lab/nft: do not edit.\n", r.node)
	fmt.Fprintf(&b, "table %s\ndelete table %s\ntable %s {\n", t, t, t)
	for _, c := range r.counters {
		fmt.Fprintf(&b, "\tcounter %s {\n\t}\n", c)
	}
	r.nat.name = "prerouting"
	r.nat.head = "type nat hook prerouting priority dstnat; policy accept;"
	fwd := chain{name: "forward", head: "type filter hook forward priority filter; policy accept;"}
	fwd.rules = append(fwd.rules,
		`ct state established,related accept comment "established"`,
		`ct state invalid counter drop comment "invalid"`)
	fwd.rules = append(fwd.rules, r.noEP...)
	if len(r.dispatchE) > 0 {
		fwd.rules = append(fwd.rules, "iifname vmap { "+strings.Join(r.dispatchE, ", ")+` } comment "egress policy of local pods"`)
	}
	if len(r.dispatchI) > 0 {
		fwd.rules = append(fwd.rules, "oifname vmap { "+strings.Join(r.dispatchI, ", ")+` } comment "ingress policy of local pods"`)
	}
	for _, c := range append([]chain{r.nat, fwd}, r.chains...) {
		fmt.Fprintf(&b, "\n\tchain %s {\n", c.name)
		if c.head != "" {
			fmt.Fprintf(&b, "\t\t%s\n", c.head)
		}
		for _, rule := range c.rules {
			fmt.Fprintf(&b, "\t\t%s\n", rule)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// quote returns s as an nft quoted string (comments, log prefixes).
func quote(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r < 0x20 || r > 0x7e {
			return '_'
		}
		return r
	}, s)
	return `"` + s + `"`
}

func lowerProto(p *corev1.Protocol) string {
	return strings.ToLower(string(cmp.Or(ptr.Deref(p, ""), corev1.ProtocolTCP)))
}

// ServicePort is one port of one Service ClusterIP of one family, with
// the ready endpoints of that family (the load-balancing model that Render
// and the lab's Open vSwitch datapath both translate).
type ServicePort struct {
	// ID is "ns/name/port/v4" (port name, or number when unnamed).
	ID        string
	VIP       netip.Addr
	Port      int32
	Proto     string // tcp, udp or sctp
	Endpoints []netip.AddrPort
}

// ServicePorts returns every ClusterIP port of the manifest's Services,
// sorted by Service, then ClusterIP, then port. Headless Services have none.
func ServicePorts(m *manifest.Manifest) ([]ServicePort, error) {
	r := &renderer{m: m}
	svcs := slices.Clone(m.Services)
	slices.SortFunc(svcs, func(a, b corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	var out []ServicePort
	for _, svc := range svcs {
		for _, ipStr := range svc.Spec.ClusterIPs {
			if ipStr == "" || ipStr == corev1.ClusterIPNone {
				continue
			}
			ip, err := netip.ParseAddr(ipStr)
			if err != nil {
				return nil, fmt.Errorf("service %s/%s: cluster IP %q: %w", svc.Namespace, svc.Name, ipStr, err)
			}
			ip = ip.Unmap()
			f := familyOf(ip)
			for _, sp := range svc.Spec.Ports {
				portID := cmp.Or(sp.Name, strconv.Itoa(int(sp.Port)))
				out = append(out, ServicePort{
					ID: svc.Namespace + "/" + svc.Name + "/" + portID + "/" + f.suffix, VIP: ip, Port: sp.Port,
					Proto: lowerProto(&sp.Protocol), Endpoints: r.endpoints(&svc, &sp, f),
				})
			}
		}
	}
	return out, nil
}

// services renders ClusterIP DNAT: per Service port and family, a chain that
// picks an endpoint of the same family at random and one chain per endpoint
// that DNATs to it. A port without ready endpoints is rejected in forward.
func (r *renderer) services() error {
	sps, err := ServicePorts(r.m)
	if err != nil {
		return err
	}
	for _, sp := range sps {
		f := familyOf(sp.VIP)
		id, proto, eps := sp.ID, sp.Proto, sp.Endpoints
		match := fmt.Sprintf("%s daddr %s %s dport %d", f.l3, sp.VIP, proto, sp.Port)
		if len(eps) == 0 {
			r.noEP = append(r.noEP, fmt.Sprintf("%s counter reject comment %s", match, quote("no endpoints "+id)))
			continue
		}
		svcChain := ident("svc/" + id)
		r.nat.rules = append(r.nat.rules, fmt.Sprintf("%s jump %s", match, svcChain))
		var vmap []string
		for k, ep := range eps {
			epChain := ident("ep/" + id + "/" + strconv.Itoa(k))
			vmap = append(vmap, fmt.Sprintf("%d : jump %s", k, epChain))
			r.chains = append(r.chains, chain{name: epChain, rules: []string{
				fmt.Sprintf("meta l4proto %s counter dnat %s to %s comment %s", proto, f.l3, ep, quote("endpoint "+ep.String()+" of "+id)),
			}})
		}
		r.chains = append(r.chains, chain{name: svcChain, rules: []string{
			fmt.Sprintf("numgen random mod %d vmap { %s }", len(eps), strings.Join(vmap, ", ")),
		}})
	}
	return nil
}

// endpoints returns the ready endpoints of family f for service port sp, with
// the target port from the EndpointSlice port of the same name and protocol.
func (r *renderer) endpoints(svc *corev1.Service, sp *corev1.ServicePort, f family) []netip.AddrPort {
	var out []netip.AddrPort
	for _, sl := range r.m.EndpointSlices {
		if sl.Namespace != svc.Namespace || sl.Labels[manifest.LabelServiceName] != svc.Name || string(sl.AddressType) != string(f.k8s) {
			continue
		}
		var port int32 = -1
		for _, p := range sl.Ports {
			if ptr.Deref(p.Name, "") == sp.Name && cmp.Or(ptr.Deref(p.Protocol, ""), corev1.ProtocolTCP) == cmp.Or(sp.Protocol, corev1.ProtocolTCP) && p.Port != nil {
				port = *p.Port
			}
		}
		if port <= 0 || port > 65535 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if !ptr.Deref(ep.Conditions.Ready, true) {
				continue
			}
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && familyOf(ip) == f {
					out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(port)))
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out)
}
