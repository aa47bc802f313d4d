// Package enrich adds Kubernetes identities to flow records: for each end
// the pod, namespace, workload, node and zone; the Service a flow was
// addressed to with its port name; and the flow type (intra-node,
// inter-node, to-external, from-external). IPv4 and IPv6 are handled
// alike: every entry of status.podIPs, spec.clusterIPs, node addresses and
// pod CIDRs is indexed, and each family's EndpointSlice is indexed on its
// own.
//
// An Enricher watches Pods, Services, EndpointSlices, Nodes, Namespaces,
// ReplicaSets, Jobs and NetworkPolicies with client-go shared informers
// (in a cluster, through a kubeconfig, or from manifest files in inventory
// mode), trims each object in the informer's transform, and derives
// time-aware address histories, so that a reused pod IP resolves to the
// pod that held it at the flow's time and deleted objects still resolve
// during a grace period. The mapping does not depend on the order in which
// events of different objects arrive.
//
// Usage:
//
//	cfg := enrich.NewConfig()
//	cfg.BindFlags(fs) // --k8s.*
//	...
//	cfg.SetDefaults()
//	e, err := enrich.New(cfg, reg, log)
//	go e.Run(ctx)                 // owns the informers until ctx ends
//	err = e.WaitForSync(ctx)      // before serving
//	e.Enrich(recs)                // any goroutine; allocation-free
//
// The minimal RBAC (list and watch only) is in rbac.yaml; README.md has the
// memory cost per pod.
package enrich

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/traceflow/probes"
)

// ErrDisabled is returned by New when the configuration's source is off.
var ErrDisabled = errors.New("kubernetes enrichment is off (--k8s.source=off, or auto found no cluster)")

// Enricher is the Kubernetes enrichment stage. Build it with New, start
// it with Run, wait for WaitForSync before relying on
// it. Enrich, NodesForIPs and the accessors are safe for concurrent use,
// before and after sync (before, they see a partial index).
type Enricher struct {
	cfg    Config
	log    *slog.Logger
	client kubernetes.Interface
	x      *index
	tr     *transformer
	m      *metrics
	inv    *inventorySource // the inventory source's files, reloaded when they change; else nil
	health *apiHealth       // the client transport's lists and watches; nil for inventory mode

	probes atomic.Pointer[probes.Registry] // SetProbes; nil: no marking

	started  atomic.Bool
	gen      atomic.Uint64 // counts the events applied to the index (Generation)
	synced   chan struct{} // closed once every informer's initial list is indexed
	failed   chan struct{} // closed when Run returns before sync
	failOnce sync.Once
	runErr   error // set before failed is closed
}

// New builds an Enricher from cfg: a client for the in-cluster or
// kubeconfig source, or the inventory files loaded into an object store
// (inventory.Load errors name the file, document and object). Metrics are
// registered on reg unless it is nil. It returns ErrDisabled when the
// source is off.
func New(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Enricher, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, ErrDisabled
	}
	if log == nil {
		log = slog.Default()
	}
	var h *apiHealth
	if cfg.Source == SourceInCluster || cfg.Source == SourceKubeconfig {
		h = newAPIHealth(DefaultRetryInterval, DefaultStaleAfter, newWatchErrors(), log)
	}
	client, inv, err := newClient(cfg, log, h)
	if err != nil {
		return nil, err
	}
	e, err := newEnricher(cfg, client, reg, log, h)
	if err != nil {
		return nil, err
	}
	e.inv = inv
	return e, nil
}

// Client is the clientset the Enricher watches through: nil in
// inventory mode (manifest files, no API server).
func (e *Enricher) Client() kubernetes.Interface {
	if e == nil || e.inv != nil {
		return nil
	}
	return e.client
}

// newEnricher builds an Enricher that watches through client (a real or
// a fake clientset) with the API health tracker h of client's transport
// (nil when client has no transport to watch: a fake clientset); cfg's
// Source, Kubeconfig, Context and Inventory are not used.
func newEnricher(cfg Config, client kubernetes.Interface, reg prometheus.Registerer, log *slog.Logger, h *apiHealth) (*Enricher, error) {
	cfg.SetDefaults()
	v := cfg
	v.Source, v.Kubeconfig, v.Inventory = SourceAuto, "", nil
	if err := v.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	x := newIndex(time.Now, cfg.GracePeriod, cfg.EnableIPv6)
	x.serviceCIDRs, x.clusterCIDRs = cfg.ServiceCIDRs, cfg.ClusterCIDRs
	e := &Enricher{
		cfg: cfg, log: log, client: client, x: x, health: h,
		synced: make(chan struct{}), failed: make(chan struct{}),
	}
	e.m = newMetrics(reg, x, h)
	e.tr = &transformer{in: newInterner(), ipv6: cfg.EnableIPv6, invalid: func(kind, reason string) {
		e.m.invalid.WithLabelValues(kind, reason).Inc()
	}}
	return e, nil
}

// watched is one informer and the kind it watches.
type watched struct {
	kind     string
	informer cache.SharedIndexInformer
}

func (e *Enricher) informers(f informers.SharedInformerFactory) []watched {
	return []watched{
		{"pod", f.Core().V1().Pods().Informer()},
		{"service", f.Core().V1().Services().Informer()},
		{"endpointslice", f.Discovery().V1().EndpointSlices().Informer()},
		{"node", f.Core().V1().Nodes().Informer()},
		{"namespace", f.Core().V1().Namespaces().Informer()},
		{"replicaset", f.Apps().V1().ReplicaSets().Informer()},
		{"job", f.Batch().V1().Jobs().Informer()},
		{"networkpolicy", f.Networking().V1().NetworkPolicies().Informer()},
	}
}

// Resources lists the API resources the Enricher lists and watches
// (group/resource, core group empty), as rbac.yaml grants them.
var Resources = []string{"/pods", "/services", "discovery.k8s.io/endpointslices", "/nodes", "/namespaces",
	"apps/replicasets", "batch/jobs", "networking.k8s.io/networkpolicies"}

// Run starts the informers, indexes their initial lists, then follows
// their events until ctx ends; it also forgets deleted objects once the
// grace period has passed. It returns nil when ctx ends, or an error when
// the initial lists are not done within the sync timeout (naming the
// kinds still missing, typically for lack of RBAC). Every goroutine it
// starts has stopped when it returns. Run may be called once.
func (e *Enricher) Run(ctx context.Context) (err error) {
	if !e.started.CompareAndSwap(false, true) {
		return errors.New("enrich: Run called twice")
	}
	defer func() {
		if !e.Synced() {
			ferr := err
			if ferr == nil {
				ferr = ctx.Err()
			}
			e.fail(ferr)
		}
	}()
	runCtx, cancel := context.WithCancel(ctx)
	// The informers of the client's API server, or of the inventory's
	// store (no client).
	var ws []watched
	var startInformers func()
	var running sync.WaitGroup
	if e.inv != nil {
		ws = e.inv.store.informers()
		startInformers = func() {
			for _, w := range ws {
				running.Go(func() { w.informer.RunWithContext(runCtx) })
			}
		}
	} else {
		factory := informers.NewSharedInformerFactoryWithOptions(e.client, 0)
		ws = e.informers(factory)
		startInformers = func() { factory.Start(runCtx.Done()) }
		defer factory.Shutdown() // after cancel (deferred later, run first): waits for the informers' goroutines
	}
	var probing sync.WaitGroup
	defer func() {
		cancel()
		running.Wait()
		probing.Wait()
		if e.health != nil {
			e.health.stop()
		}
	}()
	if e.health != nil {
		probing.Go(func() { e.health.runProbe(runCtx, DefaultProbeInterval, e.probeAPIServer) })
	}
	regs := make([]cache.ResourceEventHandlerRegistration, len(ws))
	for i, w := range ws {
		if err := w.informer.SetTransform(e.tr.transform); err != nil {
			return fmt.Errorf("enrich: %s informer transform: %w", w.kind, err)
		}
		if err := w.informer.SetWatchErrorHandlerWithContext(e.watchErrorHandler(w.kind)); err != nil {
			return fmt.Errorf("enrich: %s informer error handler: %w", w.kind, err)
		}
		regs[i], err = w.informer.AddEventHandler(e.handler())
		if err != nil {
			return fmt.Errorf("enrich: %s informer handler: %w", w.kind, err)
		}
	}
	startInformers()

	start := time.Now()
	syncCtx, syncCancel := context.WithTimeout(runCtx, e.cfg.SyncTimeout)
	defer syncCancel()
	synced := make([]cache.InformerSynced, len(regs))
	for i, r := range regs {
		synced[i] = r.HasSynced // the handler has seen the whole initial list
	}
	if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
		if ctx.Err() != nil {
			return nil
		}
		var missing []string
		for i, r := range regs {
			if !r.HasSynced() {
				missing = append(missing, ws[i].kind)
			}
		}
		return fmt.Errorf("enrich: initial list of %s not done after %v (check RBAC: rbac.yaml; dualflow_enrich_watch_errors_total)",
			strings.Join(missing, ", "), e.cfg.SyncTimeout)
	}
	e.m.synced.Set(1)
	close(e.synced)
	counts := e.x.counts()
	e.log.Info("kubernetes index synced", "source", e.cfg.Source, "took", time.Since(start).Round(time.Millisecond),
		"pods", counts["pod"], "services", counts["service"], "endpointslices", counts["endpointslice"], "nodes", counts["node"])

	tick := time.NewTicker(collectInterval(e.cfg.GracePeriod))
	defer tick.Stop()
	var reload <-chan time.Time
	if e.inv != nil && e.cfg.InventoryReload > 0 {
		t := time.NewTicker(e.cfg.InventoryReload)
		defer t.Stop()
		reload = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if n := e.x.collect(); n > 0 {
				e.m.collected.Add(float64(n))
			}
		case <-reload:
			e.reloadInventory()
		}
	}
}

// reloadInventory applies changed inventory files. A file that does not
// load is logged and counted, and the objects stay as they were.
func (e *Enricher) reloadInventory() {
	start := time.Now()
	r, err := e.inv.reload()
	switch {
	case errors.Is(err, errUnchanged):
		return
	case errors.Is(err, ErrEmptyInventoryFile):
		e.m.reloads.WithLabelValues("empty").Inc()
		e.log.Warn("inventory reload refused: a file is empty; keeping its objects until it has objects again", "err", err)
		return
	case err != nil:
		e.m.reloads.WithLabelValues("error").Inc()
		e.log.Error("inventory reload failed; keeping the objects loaded before", "files", e.inv.files, "err", err)
		return
	}
	e.m.reloads.WithLabelValues("ok").Inc()
	e.log.Info("inventory reloaded", "files", e.inv.files, "created", r.created, "updated", r.updated,
		"deleted", r.deleted, "took", time.Since(start).Round(time.Millisecond))
}

// collectInterval is how often ended claims are collected: a tenth of the
// grace period (so they live at most 10% longer), between 1 s and 1 min.
func collectInterval(grace time.Duration) time.Duration {
	return min(max(grace/10, time.Second), time.Minute)
}

// handler applies an informer's events to the index, then counts a new
// generation (after the change, so that a Snapshot taken in between is
// refreshed again rather than kept stale).
func (e *Enricher) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { e.x.set(obj); e.gen.Add(1) },
		UpdateFunc: func(_, obj any) { e.x.set(obj); e.gen.Add(1) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			e.x.remove(obj)
			e.gen.Add(1)
		},
	}
}

// watchErrorHandler counts list/watch failures and logs them, at most once
// a minute per kind (the informer retries with backoff, and would
// otherwise log every attempt).
func (e *Enricher) watchErrorHandler(kind string) cache.WatchErrorHandlerWithContext {
	var last atomic.Int64
	c := e.m.watchErrors.WithLabelValues(kind, "informer")
	return func(_ context.Context, _ *cache.Reflector, err error) {
		if e.health == nil { // else the transport counted the failure
			c.Inc()
		}
		now := time.Now().UnixNano()
		if l := last.Load(); now-l >= int64(time.Minute) && last.CompareAndSwap(l, now) {
			e.log.Warn("kubernetes list/watch failed; retrying", "kind", kind, "err", err)
		}
	}
}

func (e *Enricher) fail(err error) {
	e.failOnce.Do(func() {
		e.runErr = err
		close(e.failed)
	})
}

// WaitForSync blocks until the initial lists are indexed (nil), Run gave
// up (its error), or ctx ends (ctx.Err()).
func (e *Enricher) WaitForSync(ctx context.Context) error {
	select {
	case <-e.synced:
		return nil
	case <-e.failed:
		if e.runErr == nil {
			return errors.New("enrich: stopped before sync")
		}
		return e.runErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Synced reports whether the initial lists are indexed.
func (e *Enricher) Synced() bool {
	select {
	case <-e.synced:
		return true
	default:
		return false
	}
}

// SetProbes makes Enrich mark the records of the
// traceflow probes r remembers (flow.Record.ProbeTraceID), so that traces
// do not count as traffic. nil stops it. Safe to call at any time. (The
// registry is a concrete type, not an interface: through an interface the
// records Enrich is given would escape to the heap.)
func (e *Enricher) SetProbes(r *probes.Registry) { e.probes.Store(r) }

// Enrich fills the Kubernetes fields of every record of recs, under one
// read lock: Src and Dst (pod, namespace, labels, workload, node, zone),
// Service (for a flow addressed to a Service: its ServiceAddr, or a
// Service address as DstAddr when there was no DNAT) and Type. Addresses
// resolve at the flow's time (FlowStart, else FlowEnd, else now). Fields
// nothing was found for keep their values. A traceflow probe's record gets
// its trace id (SetProbes). The records' Labels maps are shared:
// read-only. Safe for concurrent use; it allocates nothing. It is the
// collector pipeline's enrich stage (pipeline.Enricher).
func (e *Enricher) Enrich(recs []flow.Record) {
	if len(recs) == 0 {
		return
	}
	var n [2][2]int
	var now int64
	stale := e.Stale()
	e.x.mu.RLock()
	for i := range recs {
		if now == 0 {
			now = e.nowFor(&recs[i])
		}
		recs[i].K8sViewStale = stale
		r := e.x.enrich(&recs[i], now)
		f := familyIndex(&recs[i])
		n[f][hitIndex(r.srcHit)]++
		n[f][hitIndex(r.dstHit)]++
	}
	e.x.mu.RUnlock()
	if p := e.probes.Load(); p != nil {
		p.Mark(recs)
	}
	for f := range n {
		for h := range n[f] {
			if n[f][h] > 0 {
				e.m.lookups[f][h].Add(float64(n[f][h]))
			}
		}
	}
}

// probeAPIServer asks the API server's /readyz (readable by every
// authenticated user: system:public-info-viewer). Only a failure to get
// an answer counts: an answer of any status proves the host is there.
func (e *Enricher) probeAPIServer(ctx context.Context) error {
	err := e.client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
	if _, isStatus := err.(apierrors.APIStatus); isStatus {
		return nil
	}
	return err
}

// Stale reports whether the view of the cluster is stale: some watched
// kind has had no open watch for DefaultStaleAfter (the API server is
// unreachable, or refuses the collector). Records enriched meanwhile are
// marked (flow.Record.K8sViewStale, column k8s_view_stale). Always false
// in inventory mode.
func (e *Enricher) Stale() bool { return e.health != nil && e.health.stale.Load() }

// Source returns where the objects come from (auto resolved).
func (e *Enricher) Source() Source { return e.cfg.Source }

// Status returns the state of the view of each watched kind, sorted by
// kind; nil when the client is not an API server's (inventory mode).
func (e *Enricher) Status() []KindStatus {
	if e.health == nil {
		return nil
	}
	return e.health.status()
}

// nowFor reads the clock only for a record without times (the clock is
// not free in every VM).
func (e *Enricher) nowFor(r *flow.Record) int64 {
	if r.FlowStart.IsZero() && r.FlowEnd.IsZero() {
		return e.x.now().UnixNano()
	}
	return 0
}

func familyIndex(r *flow.Record) int {
	a := r.SrcAddr
	if !a.IsValid() {
		a = r.DstAddr
	}
	if flow.Version(a) == 6 {
		return 1
	}
	return 0
}

func hitIndex(hit bool) int {
	if hit {
		return 0
	}
	return 1
}

// at converts an optional time to unix ns (zero: now).
func (e *Enricher) at(t time.Time) int64 {
	if t.IsZero() {
		return e.x.now().UnixNano()
	}
	return t.UnixNano()
}

// NodesForIPs sets nodes[i] to the node hosting address addrs[i] now, ""
// when none is known: the node of the pod holding it, the node it belongs
// to (node address, host-network pod), or the node whose pod CIDR contains
// it. Addresses given up within the grace period still resolve to their
// last holder. It reads the clock once and takes the read lock once for
// all of addrs (the correlation stage asks for a batch's addresses at
// once); it panics if nodes is shorter than addrs. It allocates nothing.
func (e *Enricher) NodesForIPs(addrs []netip.Addr, nodes []string) {
	now := e.x.now().UnixNano()
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	e.x.nodesFor(addrs, nodes, now)
}

// LookupPod returns the pod that held address a at time t (zero: now),
// host-network pods excepted (their addresses are their node's).
func (e *Enricher) LookupPod(a netip.Addr, t time.Time) (*Pod, bool) {
	if a = a.Unmap(); a.Is6() && !e.cfg.EnableIPv6 {
		return nil, false // indexed for NodesForIPs only
	}
	ts := e.at(t)
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	return e.x.podIPs.resolve(&a, ts, ts, nil)
}

// Pod returns the live pod namespace/name.
func (e *Enricher) Pod(namespace, name string) (*Pod, bool) {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	p, ok := e.x.pods[nsName{namespace, name}]
	return p, ok
}

// Workload returns the top-level controller of p (see Workload).
func (e *Enricher) Workload(p *Pod) Workload {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	return e.x.workload(p)
}

// Namespace returns the live namespace called name, with its labels (for
// namespaceSelector evaluation).
func (e *Enricher) Namespace(name string) (*Namespace, bool) {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	n, ok := e.x.namespaces[name]
	return n, ok
}

// NetworkPolicies returns the NetworkPolicies of namespace, sorted by
// name. The slice and the policies are shared and never modified
// afterwards (a change builds a new slice): read-only.
func (e *Enricher) NetworkPolicies(namespace string) []*networkingv1.NetworkPolicy {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	return e.x.policies[namespace]
}

// Service returns the live Service namespace/name.
func (e *Enricher) Service(namespace, name string) (*Service, bool) {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	s, ok := e.x.services[nsName{namespace, name}]
	return s, ok
}

// LookupService returns the Service holding address a (cluster, external
// or load-balancer IP) at time t (zero: now).
func (e *Enricher) LookupService(a netip.Addr, t time.Time) (*Service, bool) {
	ts := e.at(t)
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	a = a.Unmap()
	return e.x.svcIPs.resolve(&a, ts, ts, nil)
}

// EndpointSlices returns the live EndpointSlices of Service
// namespace/name whose family the Service has, sorted by name (a new
// slice; the slices it points to are shared and read-only).
func (e *Enricher) EndpointSlices(namespace, service string) []*EndpointSlice {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	return e.x.endpointSlices(namespace, service)
}

// Node returns the live node called name.
func (e *Enricher) Node(name string) (*Node, bool) {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	n, ok := e.x.nodes[name]
	return n, ok
}

// NodeNames returns the names of the live nodes, sorted.
func (e *Enricher) NodeNames() []string {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	return slices.Sorted(maps.Keys(e.x.nodes))
}

// Zone returns the zone of node name ("" if unknown). A deleted node's
// zone is remembered.
func (e *Enricher) Zone(node string) string {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	return e.x.zone(node)
}
