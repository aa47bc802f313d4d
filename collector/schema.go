package collector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/migrations"
)

// schemaCheckInterval is how often a running collector compares the
// database with what the migrations create, and repairs it. A variable
// for the tests.
var schemaCheckInterval = 30 * time.Second

// schemaMetrics count what the schema keeper (migrations.Keeper) repairs:
// the ledger says which migrations ran, not that what they created is
// still there (DROP TABLE dualflow.flows through SQL left the store empty
// for good, readiness green).
type schemaMetrics struct {
	repaired *prometheus.CounterVec
	broken   prometheus.Gauge
}

func newSchemaMetrics(reg prometheus.Registerer) *schemaMetrics {
	m := &schemaMetrics{
		repaired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_store_schema_repairs_total",
			Help: "Objects of the schema recreated because they were missing (missing_table, missing_view, missing_column): someone dropped them, and the rows they held are gone.",
		}, []string{"kind"}),
		broken: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dualflow_store_schema_broken",
			Help: "1 while the database differs from the migrations in a way the last check could not repair (a column of another type); /readyz fails meanwhile.",
		}),
	}
	reg.MustRegister(m.repaired, m.broken)
	return m
}

// keepSchema builds the schema's reference, repairs what is missing now,
// and keeps the keeper for Run. A user who may not create the scratch
// database (a server user with DDL on dualflow only) runs without it.
func (c *Collector) keepSchema(ctx context.Context, r *migrations.Runner) error {
	k, err := r.Keeper(ctx)
	if store.Forbidden(err) {
		c.log.Warn("the schema is not checked: this collector's ClickHouse user may not create the scratch database of the reference", "err", err)
		return nil
	}
	if err != nil || k == nil { // k nil: the cluster form
		return err
	}
	c.schema, c.schemaM = k, newSchemaMetrics(c.reg)
	c.reportRepairs(k.Ensure(ctx))
	return nil
}

// reportRepairs logs and counts what a schema check repaired, and what it
// could not.
func (c *Collector) reportRepairs(fixed []migrations.Problem, err error) {
	for _, p := range fixed {
		c.schemaM.repaired.WithLabelValues(p.Kind).Inc()
	}
	if len(fixed) > 0 {
		c.log.Warn("recreated what the migrations create and the database lacked (someone dropped it; rows it held are gone)", "repaired", migrations.Describe(fixed))
	}
	c.schemaM.broken.Set(0)
	if err != nil {
		c.schemaM.broken.Set(1)
		c.log.Error("the schema differs from the migrations; /readyz fails until it is fixed", "err", err)
	}
}

// Readiness reports whether the collector serves: started, its schema
// whole, and the flows table taking rows. /readyz (metrics port and web)
// answers 503 with the reason otherwise.
func (c *Collector) Readiness(ctx context.Context) error {
	select {
	case <-c.ready:
	default:
		return errors.New("starting")
	}
	if err := c.schema.Err(); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	return c.writer.Writable()
}
