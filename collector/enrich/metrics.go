package enrich

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// Result labels of dualflow_enrich_lookups_total.
const (
	resultHit  = "hit"
	resultMiss = "miss"
)

var families = [2]string{"ipv4", "ipv6"}

// metrics are the enrichment's Prometheus instruments. The per-record
// counters are resolved once so the hot path only adds.
type metrics struct {
	lookups     [2][2]prometheus.Counter // [family][hit=0, miss=1]
	invalid     *prometheus.CounterVec   // kind, reason
	watchErrors *prometheus.CounterVec   // kind
	collected   prometheus.Counter
	synced      prometheus.Gauge
	reloads     *prometheus.CounterVec // result
}

// newWatchErrors returns dualflow_enrich_watch_errors_total.
func newWatchErrors() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dualflow_enrich_watch_errors_total",
		Help: "Failed lists and watches of the Kubernetes API, by kind and reason: refused or unreachable (the API server is down; the request is retried every second), http_<code> (e.g. http_403: RBAC), stream (an open watch broke), error (other transport errors), informer (inventory mode). The informers keep retrying.",
	}, []string{"kind", "reason"})
}

// newMetrics returns the enrichment's metrics; h, the API health tracker,
// may be nil (inventory mode).
func newMetrics(reg prometheus.Registerer, x *index, h *apiHealth) *metrics {
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dualflow_enrich_lookups_total",
		Help: "Flow endpoint addresses looked up in the Kubernetes index, by family; hit means a pod or a node was found.",
	}, []string{"family", "result"})
	m := &metrics{
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_enrich_invalid_total",
			Help: "Values of Kubernetes objects dropped while indexing (unparsable IPs or CIDRs, endpoint addresses of the wrong family).",
		}, []string{"kind", "reason"}),
		collected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_enrich_expired_claims_total",
			Help: "Addresses of deleted objects (or given up by an object) forgotten after the grace period.",
		}),
		synced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dualflow_enrich_synced",
			Help: "1 once the initial list of every watched kind is indexed.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_enrich_inventory_reloads_total",
			Help: "Reloads of changed inventory files (inventory source), by result: ok; error (a file did not load); empty (a file that held objects has none, e.g. caught mid-rewrite). On error and empty the objects loaded before stay.",
		}, []string{"result"}),
	}
	if h != nil {
		m.watchErrors = h.errs
	} else {
		m.watchErrors = newWatchErrors()
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	m.reloads.WithLabelValues("empty")
	for f := range families {
		m.lookups[f][0] = lookups.WithLabelValues(families[f], resultHit)
		m.lookups[f][1] = lookups.WithLabelValues(families[f], resultMiss)
	}
	if reg != nil {
		reg.MustRegister(lookups, m.invalid, m.watchErrors, m.collected, m.synced, m.reloads, &indexCollector{x: x})
		if h != nil {
			reg.MustRegister(&healthCollector{h: h})
		}
	}
	return m
}

var (
	objectsDesc = prometheus.NewDesc("dualflow_enrich_objects",
		"Live Kubernetes objects indexed, by kind.", []string{"kind"}, nil)
	retainedDesc = prometheus.NewDesc("dualflow_enrich_retained_claims",
		"Addresses kept for late records after their object was deleted or gave them up (see --k8s.grace-period).", nil, nil)
)

// indexCollector reads the index's sizes at scrape time.
type indexCollector struct{ x *index }

func (c *indexCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- objectsDesc
	ch <- retainedDesc
}

func (c *indexCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.x.counts()
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(counts[k]), k)
	}
	ch <- prometheus.MustNewConstMetric(retainedDesc, prometheus.GaugeValue, float64(c.x.retained()))
}

var (
	watchingDesc = prometheus.NewDesc("dualflow_enrich_watching",
		"1 while a watch of the kind is open (its view is current), 0 while the API server cannot be reached or refuses it.", []string{"kind"}, nil)
	viewAgeDesc = prometheus.NewDesc("dualflow_enrich_view_stale_seconds",
		"How long the kind has been without an open watch: 0 while watching. Names of that kind may be out of date meanwhile.", []string{"kind"}, nil)
	lastOKDesc = prometheus.NewDesc("dualflow_enrich_last_ok_timestamp_seconds",
		"Unix time of the last successful list or watch data of the kind.", []string{"kind"}, nil)
	staleDesc = prometheus.NewDesc("dualflow_enrich_view_stale",
		"1 while some kind has been without a watch for 3 s or more: rows enriched meanwhile have k8s_view_stale = true.", nil, nil)
)

// healthCollector reads the API health tracker at scrape time.
type healthCollector struct{ h *apiHealth }

func (c *healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- watchingDesc
	ch <- viewAgeDesc
	ch <- lastOKDesc
	ch <- staleDesc
}

func (c *healthCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.h.status() {
		w := 0.0
		if s.Watching {
			w = 1
		}
		ch <- prometheus.MustNewConstMetric(watchingDesc, prometheus.GaugeValue, w, s.Kind)
		ch <- prometheus.MustNewConstMetric(viewAgeDesc, prometheus.GaugeValue, s.StaleFor.Seconds(), s.Kind)
		last := 0.0
		if !s.LastOK.IsZero() {
			last = float64(s.LastOK.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(lastOKDesc, prometheus.GaugeValue, last, s.Kind)
	}
	st := 0.0
	if c.h.stale.Load() {
		st = 1
	}
	ch <- prometheus.MustNewConstMetric(staleDesc, prometheus.GaugeValue, st)
}
