package recommend

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
)

// Change says what applying a recommended policy does to the policies in
// force.
type Change string

const (
	// Added: no policy of that namespace and name is in force.
	Added Change = "added"
	// Changed: it replaces the policy of the same namespace and name.
	Changed Change = "changed"
)

// PolicyDiff is one recommended policy against the policies in force: in
// words, and as YAML.
type PolicyDiff struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Change    Change `json:"change"`
	// Summary says in sentences what the policy changes: which pods it
	// isolates and whether they were isolated before (added), the rules
	// and peers it adds or removes (changed).
	Summary []string `json:"summary"`
	// Current is the policy in force as kubectl apply takes it (changed
	// only), Proposed the recommended one with its comments.
	Current  string `json:"current,omitempty"`
	Proposed string `json:"proposed"`
	// Unified is the unified diff from Current to Proposed (changed
	// only).
	Unified string `json:"unified,omitempty"`
}

// Diff compares each recommended policy with the policies of view in
// force; docs are the policies' YAML documents (render), in order.
func Diff(view *enrich.Snapshot, rec *Recommendation, docs [][]byte) ([]PolicyDiff, error) {
	current := map[[2]string]*networkingv1.NetworkPolicy{}
	for _, p := range view.NetworkPolicies {
		current[[2]string{p.Namespace, p.Name}] = p
	}
	ix := &diffIndex{view: view, pods: map[string][]*enrich.Pod{}, policies: map[string][]*networkingv1.NetworkPolicy{}, workload: map[*enrich.Pod]*enrich.Workload{}}
	for i, p := range view.Pods {
		ix.pods[p.Namespace] = append(ix.pods[p.Namespace], p)
		if i < len(view.Workloads) && view.Workloads[i].Name != "" {
			ix.workload[p] = &view.Workloads[i]
		}
	}
	for _, p := range view.NetworkPolicies {
		ix.policies[p.Namespace] = append(ix.policies[p.Namespace], p)
	}
	out := make([]PolicyDiff, 0, len(rec.Policies))
	for i := range rec.Policies {
		p := rec.Policies[i].Policy
		d := PolicyDiff{Namespace: p.Namespace, Name: p.Name, Change: Added, Proposed: string(docs[i]), Summary: []string{}}
		cur, ok := current[[2]string{p.Namespace, p.Name}]
		if !ok {
			d.Summary = ix.addedSummary(p)
			out = append(out, d)
			continue
		}
		d.Change = Changed
		c, err := policyNode(&Policy{Policy: cleanCopy(cur)})
		if err != nil {
			return nil, fmt.Errorf("policy %s/%s: %w", cur.Namespace, cur.Name, err)
		}
		cb, err := encodeNode(c)
		if err != nil {
			return nil, fmt.Errorf("policy %s/%s: %w", cur.Namespace, cur.Name, err)
		}
		d.Current = string(cb)
		d.Unified, err = difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
			A: difflib.SplitLines(d.Current), B: difflib.SplitLines(d.Proposed),
			FromFile: "current/" + p.Namespace + "/" + p.Name, ToFile: "recommended/" + p.Namespace + "/" + p.Name, Context: 3,
		})
		if err != nil {
			return nil, err
		}
		d.Summary = changedSummary(cur, p)
		out = append(out, d)
	}
	return out, nil
}

// diffIndex is the cluster view by namespace, for the summaries.
type diffIndex struct {
	view     *enrich.Snapshot
	pods     map[string][]*enrich.Pod
	policies map[string][]*networkingv1.NetworkPolicy
	workload map[*enrich.Pod]*enrich.Workload
}

// addedSummary says which pods p isolates, in which directions, whether
// a policy in force already did, and what its rules allow.
func (ix *diffIndex) addedSummary(p *networkingv1.NetworkPolicy) []string {
	pods := ix.pods[p.Namespace]
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	if err != nil {
		return []string{fmt.Sprintf("Adds NetworkPolicy %s/%s; its pod selector is invalid: %v.", p.Namespace, p.Name, err)}
	}
	var selected []*enrich.Pod
	for _, pod := range pods {
		if sel.Matches(labels.Set(pod.Labels)) {
			selected = append(selected, pod)
		}
	}
	in, eg := policy.Types(p)
	var out []string
	for _, d := range []struct {
		on    bool
		dir   string
		rules int
		ing   bool
	}{{in, "ingress", len(p.Spec.Ingress), true}, {eg, "egress", len(p.Spec.Egress), false}} {
		if !d.on {
			continue
		}
		before := ix.isolatedBy(p.Namespace, selected, d.ing)
		s := fmt.Sprintf("Adds NetworkPolicy %s/%s: isolates the %s of %s", p.Namespace, p.Name, d.dir, ix.workloadsText(selected))
		switch {
		case len(before) == 0 && d.rules == 0:
			s += fmt.Sprintf("; no policy isolated it, so its %s was open to every peer; this policy has no rule: it denies all of it.", d.dir)
		case len(before) == 0:
			verb := "allow"
			if d.rules == 1 {
				verb = "allows"
			}
			s += fmt.Sprintf("; no policy isolated it, so its %s was open to every peer; now only this policy's %d %s %s it.", d.dir, d.rules, plural(d.rules, "rule"), verb)
		default:
			s += fmt.Sprintf("; already isolated by %s, which still allow what they allow (NetworkPolicies add up: delete them to narrow); this adds %d %s.", strings.Join(before, ", "), d.rules, plural(d.rules, "rule"))
		}
		out = append(out, s)
		if d.ing {
			for i, r := range p.Spec.Ingress {
				out = append(out, fmt.Sprintf("Ingress rule %d allows %s from %s.", i, portsText(r.Ports), peersText(r.From, p.Namespace)))
			}
		} else {
			for i, r := range p.Spec.Egress {
				out = append(out, fmt.Sprintf("Egress rule %d allows %s to %s.", i, portsText(r.Ports), peersText(r.To, p.Namespace)))
			}
		}
	}
	return out
}

// isolatedBy names the policies in force of namespace ns that select a
// pod of pods for ingress (or egress).
func (ix *diffIndex) isolatedBy(ns string, pods []*enrich.Pod, ingress bool) []string {
	var out []string
	for _, q := range ix.policies[ns] {
		if in, eg := policy.Types(q); (ingress && !in) || (!ingress && !eg) {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&q.Spec.PodSelector)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(pods, func(pod *enrich.Pod) bool { return sel.Matches(labels.Set(pod.Labels)) }) {
			out = append(out, q.Namespace+"/"+q.Name)
		}
	}
	slices.Sort(out)
	return out
}

// workloadsText names the workloads of pods ("Deployment shop/web (3
// pods)"), or says there are none.
func (ix *diffIndex) workloadsText(pods []*enrich.Pod) string {
	if len(pods) == 0 {
		return "no pod in the cluster now"
	}
	count := map[string]int{}
	for _, p := range pods {
		name := "pod " + p.Namespace + "/" + p.Name
		if w := ix.workload[p]; w != nil {
			name = w.Kind + " " + p.Namespace + "/" + w.Name
		}
		count[name]++
	}
	names := make([]string, 0, len(count))
	for n := range count {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, n := range names {
		names[i] = fmt.Sprintf("%s (%d %s)", n, count[n], plural(count[n], "pod"))
	}
	return strings.Join(names, ", ")
}

// changedSummary says, rule by rule, what proposed adds to or removes
// from cur.
func changedSummary(cur, proposed *networkingv1.NetworkPolicy) []string {
	out := []string{fmt.Sprintf("Replaces NetworkPolicy %s/%s: same pod selector and policy types; the rules below change, the others stay as they are.", cur.Namespace, cur.Name)}
	if !equality.Semantic.DeepEqual(cur.Spec.PodSelector, proposed.Spec.PodSelector) || !slices.Equal(cur.Spec.PolicyTypes, proposed.Spec.PolicyTypes) {
		out[0] = fmt.Sprintf("Replaces NetworkPolicy %s/%s, with another pod selector or policy types.", cur.Namespace, cur.Name)
	}
	type rule struct {
		peers []networkingv1.NetworkPolicyPeer
		ports []networkingv1.NetworkPolicyPort
	}
	dir := func(name, from string, a, b []rule) {
		for i := range max(len(a), len(b)) {
			switch {
			case i >= len(a):
				out = append(out, fmt.Sprintf("Adds %s rule %d: %s %s %s.", name, i, portsText(b[i].ports), from, peersText(b[i].peers, cur.Namespace)))
			case i >= len(b):
				out = append(out, fmt.Sprintf("Removes %s rule %d (%s %s %s).", name, i, portsText(a[i].ports), from, peersText(a[i].peers, cur.Namespace)))
			default:
				added, removed := setDiff(a[i].peers, b[i].peers)
				if len(added) > 0 {
					out = append(out, fmt.Sprintf("%s rule %d (%s) gains %s.", capital(name), i, portsText(b[i].ports), peersText(added, cur.Namespace)))
				}
				if len(removed) > 0 {
					out = append(out, fmt.Sprintf("%s rule %d (%s) loses %s.", capital(name), i, portsText(a[i].ports), peersText(removed, cur.Namespace)))
				}
				pa, pr := setDiff(a[i].ports, b[i].ports)
				if len(pa)+len(pr) > 0 {
					out = append(out, fmt.Sprintf("%s rule %d's ports change from %s to %s.", capital(name), i, portsText(a[i].ports), portsText(b[i].ports)))
				}
			}
		}
	}
	in := func(p *networkingv1.NetworkPolicy) []rule {
		var rs []rule
		for _, r := range p.Spec.Ingress {
			rs = append(rs, rule{r.From, r.Ports})
		}
		return rs
	}
	eg := func(p *networkingv1.NetworkPolicy) []rule {
		var rs []rule
		for _, r := range p.Spec.Egress {
			rs = append(rs, rule{r.To, r.Ports})
		}
		return rs
	}
	dir("ingress", "from", in(cur), in(proposed))
	dir("egress", "to", eg(cur), eg(proposed))
	if len(out) == 1 {
		out = append(out, "No rule changes: only metadata differs.")
	}
	return out
}

// setDiff returns the elements of b not in a (added) and of a not in b
// (removed), compared semantically.
func setDiff[T any](a, b []T) (added, removed []T) {
	has := func(xs []T, x T) bool {
		return slices.ContainsFunc(xs, func(y T) bool { return equality.Semantic.DeepEqual(x, y) })
	}
	for _, x := range b {
		if !has(a, x) {
			added = append(added, x)
		}
	}
	for _, x := range a {
		if !has(b, x) {
			removed = append(removed, x)
		}
	}
	return added, removed
}

// portsText is a rule's ports in words: "TCP/8080, UDP/dns", or "every
// protocol and port".
func portsText(ps []networkingv1.NetworkPolicyPort) string {
	if len(ps) == 0 {
		return "every protocol and port"
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		proto := string(cmp.Or(ptrVal(p.Protocol), corev1.ProtocolTCP))
		switch {
		case p.Port == nil:
			out[i] = proto + " (every port)"
		case p.EndPort != nil:
			out[i] = fmt.Sprintf("%s/%s-%d", proto, p.Port.String(), *p.EndPort)
		default:
			out[i] = proto + "/" + p.Port.String()
		}
	}
	return strings.Join(out, ", ")
}

// peersText is a rule's peers in words, relative to the policy's
// namespace ns.
func peersText(ps []networkingv1.NetworkPolicyPeer, ns string) string {
	if len(ps) == 0 {
		return "every peer"
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		switch {
		case p.IPBlock != nil:
			s := "ipBlock " + p.IPBlock.CIDR
			if len(p.IPBlock.Except) > 0 {
				s += " except " + strings.Join(p.IPBlock.Except, ", ")
			}
			out[i] = s
		default:
			pods := "every pod"
			if t := selectorText(p.PodSelector); t != "{}" {
				pods = "pods " + t
			}
			where := "of " + ns
			if p.NamespaceSelector != nil {
				where = "of namespaces " + selectorText(p.NamespaceSelector)
				if n, ok := p.NamespaceSelector.MatchLabels[corev1.LabelMetadataName]; ok && len(p.NamespaceSelector.MatchLabels) == 1 && len(p.NamespaceSelector.MatchExpressions) == 0 {
					where = "of " + n
				}
			}
			out[i] = pods + " " + where
		}
	}
	return strings.Join(out, "; ")
}

// selectorText is a label selector as kubectl prints it, "{}" for all.
func selectorText(s *metav1.LabelSelector) string {
	if s == nil {
		return "{}"
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil || sel.Empty() {
		return "{}"
	}
	return "{" + sel.String() + "}"
}

func ptrVal[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func capital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
