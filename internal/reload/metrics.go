package reload

import (
	"reflect"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Source is what Metrics reports on: a *File, a *TLS.
type Source interface {
	stats() stats
}

type stats struct {
	name            string
	reloads, errors uint64
	notAfter        time.Time // zero: no certificate
}

func (f *File[T]) stats() stats {
	s := stats{name: f.name, reloads: f.reloads.Load(), errors: f.errors.Load()}
	if c, ok := any(*f.cur.Load()).(interface{ notAfter() time.Time }); ok {
		s.notAfter = c.notAfter()
	}
	return s
}

var (
	reloadsDesc = prometheus.NewDesc("dualflow_file_reloads_total",
		"Changed certificate, key, CA or token files loaded without a restart, by name (ipfix-server, web-tokens, …).",
		[]string{"name"}, nil)
	errorsDesc = prometheus.NewDesc("dualflow_file_reload_errors_total",
		"Changed files that did not load (half written, unparsable, a key not matching its certificate), by name; the last good content stays in use.",
		[]string{"name"}, nil)
	expiryDesc = prometheus.NewDesc("dualflow_tls_certificate_expiry_timestamp_seconds",
		"When the certificate in use expires (its NotAfter, Unix seconds), by name: alert well before, in case renewals stopped.",
		[]string{"name"}, nil)
)

// Metrics returns a collector of sources' reloads and certificate expiry,
// for the registry of the component that uses them; nil sources are left
// out. It is unchecked (it describes nothing), so that each component
// registers its own files into a registry it shares with others.
func Metrics(sources ...Source) prometheus.Collector {
	var keep []Source
	for _, s := range sources {
		if s == nil {
			continue
		}
		if v := reflect.ValueOf(s); v.Kind() == reflect.Pointer && v.IsNil() {
			continue // a nil *TLS: no TLS configured
		}
		keep = append(keep, s)
	}
	return metrics(keep)
}

type metrics []Source

func (metrics) Describe(chan<- *prometheus.Desc) {}

func (m metrics) Collect(ch chan<- prometheus.Metric) {
	for _, s := range m {
		st := s.stats()
		ch <- prometheus.MustNewConstMetric(reloadsDesc, prometheus.CounterValue, float64(st.reloads), st.name)
		ch <- prometheus.MustNewConstMetric(errorsDesc, prometheus.CounterValue, float64(st.errors), st.name)
		if !st.notAfter.IsZero() {
			ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(st.notAfter.Unix()), st.name)
		}
	}
}
