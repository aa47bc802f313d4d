package enrich

import (
	"sort"

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

func newMetrics(reg prometheus.Registerer, x *index) *metrics {
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dualflow_enrich_lookups_total",
		Help: "Flow endpoint addresses looked up in the Kubernetes index, by family; hit means a pod or a node was found.",
	}, []string{"family", "result"})
	m := &metrics{
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_enrich_invalid_total",
			Help: "Values of Kubernetes objects dropped while indexing (unparsable IPs or CIDRs, endpoint addresses of the wrong family).",
		}, []string{"kind", "reason"}),
		watchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_enrich_watch_errors_total",
			Help: "List or watch failures of an informer (RBAC, API server unreachable); the informer retries.",
		}, []string{"kind"}),
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
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	m.reloads.WithLabelValues("empty")
	for f := range families {
		m.lookups[f][0] = lookups.WithLabelValues(families[f], resultHit)
		m.lookups[f][1] = lookups.WithLabelValues(families[f], resultMiss)
	}
	if reg != nil {
		reg.MustRegister(lookups, m.invalid, m.watchErrors, m.collected, m.synced, m.reloads, &indexCollector{x: x})
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
	kinds := make([]string, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(counts[k]), k)
	}
	ch <- prometheus.MustNewConstMetric(retainedDesc, prometheus.GaugeValue, float64(c.x.retained()))
}
