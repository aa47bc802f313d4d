package audit

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// This file is the what-if's reachability part: the cells of the
// Reachability page's matrix, and their pod pairs, whose verdict a
// proposal changes. They are evaluated by the matrix's evaluator
// (matrix, evaluateFamily, pairFlow), once with the policies in force and
// once with the proposal.

// WhatIfCell is a reachability cell, a workload to a workload or to a
// Service on any port of Protocol (as the Reachability page asks it), whose
// verdict the proposal changes in at least one family.
type WhatIfCell struct {
	Src      Endpoint `json:"src"`
	Dst      Endpoint `json:"dst"`
	Protocol string   `json:"protocol"`
	// Families is keyed "4" and "6", both always present; Changed says
	// which change.
	Families map[string]*WhatIfCellFamily `json:"families"`
}

// WhatIfCellFamily is one family of a cell before and after the proposal.
type WhatIfCellFamily struct {
	Changed bool        `json:"changed"`
	Before  CellVerdict `json:"before"`
	After   CellVerdict `json:"after"`
}

// CellVerdict is one family of a cell under one set of policies: the
// matrix's outcome (allow, deny, partial, or why there is no pair:
// Outcome constants), the verdict of its pairs when they agree, and how
// many of its pod pairs are allowed.
type CellVerdict struct {
	Outcome      string `json:"outcome"`
	Reason       string `json:"reason,omitempty"`
	Verdict      string `json:"verdict,omitempty"`
	PairsAllowed int    `json:"pairs_allowed"`
	PairsTotal   int    `json:"pairs_total"`
}

func cellVerdict(f *FamilyPolicy) CellVerdict {
	return CellVerdict{Outcome: f.Outcome, Reason: f.Reason, Verdict: f.Summary.Verdict, PairsAllowed: f.Allowed, PairsTotal: f.Total}
}

// WhatIfPair is a pod pair of a changed cell whose verdict the proposal
// changes: Before and After are the pair as the matrix lists it (pods,
// addresses, port, verdict, deciding policies; After's Explanation says
// why a newly denied pair is denied).
type WhatIfPair struct {
	// Cell is the index in WhatIfReport.Cells of the first cell the pair
	// belongs to (a workload's pair is also its Service's).
	Cell      int         `json:"cell"`
	IPVersion uint8       `json:"ip_version"`
	Protocol  string      `json:"protocol"`
	Change    string      `json:"change"`
	Before    PairVerdict `json:"before"`
	After     PairVerdict `json:"after"`
}

// whatIfScope is the cells a what-if evaluates: every workload of the
// proposal's namespaces to and from every workload of the cluster view,
// and to every Service whose pods or clients they may be, per protocol.
type whatIfScope struct {
	matrices []*matrix
	srcs     [][]Endpoint
	dsts     [][]Endpoint
}

// whatIfMaxPairs bounds the pod pairs of a what-if's cells (both
// families, every port), each evaluated twice at about 1.3 µs of CPU
// (BenchmarkWhatIfCells: 358,200 pairs of a 3,000-pod cluster, 0.9
// CPU-s on this project's 2-core VM): a few CPU-seconds, as
// DefaultWhatIfMaxChecks. The matrix's maxMatrixPairs is lower because
// it answers every pair; a what-if lists the changed ones only.
const whatIfMaxPairs = 1_000_000

// whatIfProtos are the protocols a what-if's cells are asked on: TCP (the
// Reachability page's default) for every destination, UDP and SCTP for
// the destinations that declare or were seen on a port of them.
var whatIfProtos = []uint8{flow.ProtoTCP, flow.ProtoUDP, flow.ProtoSCTP}

// observedKey is a destination workload and protocol of the flows a
// what-if reads.
type observedKey struct {
	ns, workload string
	proto        uint8
}

// whatIfObserved returns, per destination workload and protocol, the
// ports of where's flows to it (the MaxObservedPorts most frequent), as
// the matrix evaluates a pod that declares no port at.
func (r *Reports) whatIfObserved(ctx context.Context, where string) (map[observedKey][]uint16, error) {
	q := fmt.Sprintf(`SELECT dst_pod_namespace AS namespace, dst_workload_name AS workload, protocol, arraySort(topK(%d)(dst_port)) AS ports
FROM %s.flows WHERE %s AND dst_pod_namespace != '' AND protocol IN (%d, %d, %d)
GROUP BY namespace, workload, protocol`, MaxObservedPorts, r.db, where, flow.ProtoTCP, flow.ProtoUDP, flow.ProtoSCTP)
	type row struct {
		Namespace string   `json:"namespace"`
		Workload  string   `json:"workload"`
		Protocol  uint8    `json:"protocol"`
		Ports     []uint16 `json:"ports"`
	}
	rs, err := rows[row](ctx, r.q, q, reportMaxMemory)
	if err != nil {
		return nil, fmt.Errorf("observed ports: %w", err)
	}
	out := map[observedKey][]uint16{}
	for _, x := range rs {
		out[observedKey{x.Namespace, x.Workload, x.Protocol}] = x.Ports
	}
	return out, nil
}

// scopeWorkloads returns the workloads of view's pods with a pod in one
// of the touched namespaces, and the others, each once, in the view's
// order (namespace, then pod name).
func scopeWorkloads(view *enrich.Snapshot, touched []string) (mine, others []Endpoint) {
	seen := map[Endpoint]bool{}
	for _, p := range view.Pods {
		e := Endpoint{Kind: "workload", Namespace: p.Namespace, Name: view.Workload(p).Name}
		if seen[e] {
			continue
		}
		seen[e] = true
		if slices.Contains(touched, p.Namespace) {
			mine = append(mine, e)
		} else {
			others = append(others, e)
		}
	}
	return mine, others
}

// whatIfCells plans the cells of a what-if over view for the touched
// namespaces (see whatIfScope); observed are the ports seen per
// destination (whatIfObserved). Nothing is evaluated yet.
func whatIfCells(ctx context.Context, view *enrich.Snapshot, touched []string, observed map[observedKey][]uint16) (*whatIfScope, error) {
	mine, others := scopeWorkloads(view, touched)
	if len(mine) == 0 {
		return &whatIfScope{}, nil
	}
	res := newViewResolver(view)
	all := append(slices.Clone(mine), others...)
	var svcMine, svcOthers []Endpoint
	for _, s := range view.Services {
		if s.Selector == nil {
			continue // no known backend: its cells have no pair
		}
		e := Endpoint{Kind: "service", Namespace: s.Namespace, Name: s.Name}
		if slices.Contains(touched, s.Namespace) {
			svcMine = append(svcMine, e)
		} else {
			svcOthers = append(svcOthers, e)
		}
	}
	ev := PolicyEvaluator{Resolver: res}
	sc := &whatIfScope{}
	for _, proto := range whatIfProtos {
		// has says a destination is asked about on proto: always on TCP;
		// on UDP and SCTP if it declares a port of it (a Service: has a
		// port of it) or was seen on one.
		has := func(e Endpoint) bool {
			t, err := res.Resolve(ctx, e)
			if err != nil {
				return false
			}
			if t.Service != nil {
				return len(t.servicePorts(proto, 0)) > 0
			}
			if proto == flow.ProtoTCP || len(observed[observedKey{e.Namespace, e.Name, proto}]) > 0 {
				return true
			}
			return slices.ContainsFunc(t.Members, func(m Member) bool { return len(m.declared(proto)) > 0 })
		}
		for _, q := range []struct{ srcs, dsts []Endpoint }{
			// Into the proposal's namespaces: from every workload.
			{all, append(slices.Clone(mine), svcMine...)},
			// Out of them: to every other workload and Service.
			{mine, append(slices.Clone(others), svcOthers...)},
		} {
			dsts := slices.DeleteFunc(q.dsts, func(e Endpoint) bool { return !has(e) })
			if len(dsts) == 0 {
				continue
			}
			ports := make([][]uint16, len(dsts))
			for j, d := range dsts {
				if d.Kind == "workload" {
					ports[j] = observed[observedKey{d.Namespace, d.Name, proto}]
				}
			}
			m, err := ev.plan(ctx, q.srcs, dsts, proto, 0, ports)
			if err != nil {
				return nil, err
			}
			sc.matrices, sc.srcs, sc.dsts = append(sc.matrices, m), append(sc.srcs, q.srcs), append(sc.dsts, dsts)
		}
	}
	return sc, nil
}

// cost is the pod pairs of the scope (as the matrix counts them, per
// evaluation) and the policy checks evaluating them with before and with
// after makes.
func (sc *whatIfScope) cost(before, after *policy.Set) (pairs int, checks int64) {
	for _, m := range sc.matrices {
		p, b := m.cost(before)
		_, a := m.cost(after)
		pairs, checks = pairs+p, checks+b+a
	}
	return pairs, checks
}

// evaluate evaluates the scope's cells with before and with after and
// puts the cells and pod pairs whose verdict changes into rep.
func (sc *whatIfScope) evaluate(before, after *policy.Set, rep *WhatIfReport) {
	var lb, la int // pairs listed, the same count in both evaluations
	// A pod pair (with its family, protocol and port) is listed once: a
	// workload's pairs are also those of its Services.
	type pairKey struct {
		fam      int
		proto    uint8
		src, dst string
		port     uint16
	}
	seen := map[pairKey]bool{}
	for k, m := range sc.matrices {
		b, a := m.evaluate(before, &lb), m.evaluate(after, &la)
		proto := flow.ProtoName(m.proto)
		for i := range b {
			for j := range b[i] {
				cell := WhatIfCell{Src: sc.srcs[k][i], Dst: sc.dsts[k][j], Protocol: proto, Families: map[string]*WhatIfCellFamily{}}
				changed := false
				var pairs []WhatIfPair
				for _, fam := range []int{4, 6} {
					fb, fa := b[i][j][fam], a[i][j][fam]
					cf := &WhatIfCellFamily{Before: cellVerdict(fb), After: cellVerdict(fa), Changed: fb.Allowed != fa.Allowed}
					// The pairs are listed in the same order in both
					// evaluations, and cut at the same place.
					for n := range min(len(fb.Pairs), len(fa.Pairs)) {
						pb, pa := fb.Pairs[n], fa.Pairs[n]
						if pairAllowed(pb.Verdict) == pairAllowed(pa.Verdict) || pb.Src != pa.Src || pb.Dst != pa.Dst || pb.Port != pa.Port {
							continue
						}
						cf.Changed = true
						key := pairKey{fam, m.proto, pb.Src, pb.Dst, pb.Port}
						if seen[key] {
							continue
						}
						seen[key] = true
						change := ChangeNewlyDenied
						if pairAllowed(pa.Verdict) {
							change = ChangeNewlyAllowed
						}
						pairs = append(pairs, WhatIfPair{Cell: len(rep.Cells), IPVersion: uint8(fam), Protocol: flow.ProtoName(familyProto(m.proto, fam)), Change: change, Before: pb, After: pa})
					}
					if cf.Changed && (fb.Truncated || fa.Truncated) {
						rep.PairsTruncated = true
					}
					changed = changed || cf.Changed
					cell.Families[strconv.Itoa(fam)] = cf
				}
				if changed {
					rep.Cells = append(rep.Cells, cell)
					rep.Pairs = append(rep.Pairs, pairs...)
				}
			}
		}
	}
}

// pairAllowed says a pair's verdict (PairVerdict.Verdict) lets it through.
func pairAllowed(v string) bool {
	return v != flow.VerdictDenied.String() && v != flow.VerdictRejected.String()
}

// viewResolver is ClusterResolver over one view, each endpoint resolved
// once: a what-if asks about the same workloads and Services in several
// matrices. Not safe for concurrent use.
type viewResolver struct {
	ClusterResolver
	targets map[Endpoint]*Target
}

// newViewResolver resolves every workload of view in one pass over its
// pods.
func newViewResolver(view *enrich.Snapshot) *viewResolver {
	r := &viewResolver{ClusterResolver: ClusterResolver{Cluster: func() (*enrich.Snapshot, error) { return view, nil }}, targets: map[Endpoint]*Target{}}
	for _, p := range view.Pods {
		e := Endpoint{Kind: "workload", Namespace: p.Namespace, Name: view.Workload(p).Name}
		t := r.targets[e]
		if t == nil {
			t = &Target{}
			r.targets[e] = t
		}
		t.Members = append(t.Members, member(view, p))
	}
	return r
}

// Resolve implements Resolver.
func (r *viewResolver) Resolve(ctx context.Context, e Endpoint) (*Target, error) {
	if t, ok := r.targets[e]; ok {
		return t, nil
	}
	t, err := r.ClusterResolver.Resolve(ctx, e)
	if err == nil {
		r.targets[e] = t
	}
	return t, err
}
