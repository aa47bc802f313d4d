-- 0009: what the summary, the service map and the traffic series group
-- by, as columns, and three aggregate projections over them, so that a
-- day of flows is summed from a few hundred thousand pre-aggregated rows
-- instead of every row.
--
-- Columns (MATERIALIZED: computed by ClickHouse from the row at insert,
-- and for rows written before this migration computed when read, with the
-- same result; not shown by SELECT *):
--   src_label      the source as the API names it: namespace/workload,
--                  else namespace/pod, else the address
--   dst_label      the destination: svc:namespace/name for a Service,
--                  else namespace/workload, namespace/pod, the address
--   verdict_class  dropped (a direction denied or rejected), allowed,
--                  not_isolated or unknown, in that order of precedence
--
-- Projections (parts of the table, kept by ClickHouse itself: a query is
-- answered from one only when it gives exactly the same result as the
-- rows; parts written before this migration are covered once the
-- MATERIALIZE PROJECTION mutations below finish, and read as rows until
-- then):
--   series_1m  per minute, family and verdict class: count, bytes
--   edges_1m   per minute, family, protocol, both sides' namespace and
--              workload, the destination Service, the labels and the
--              verdict class: count, bytes
--   edges_1h   the same per hour
-- The web API asks for whole hours through toStartOfHour(flow_end), whole
-- minutes through toStartOfMinute(flow_end), and reads the partial minutes
-- at the edges of a window as rows (web/api/tiers.go).
--
--   SELECT src_label, dst_label, sum(bytes + reverse_bytes) AS bytes, count() AS flows
--   FROM dualflow.flows
--   WHERE toStartOfHour(flow_end) >= toStartOfHour(now()) - INTERVAL 24 HOUR
--   GROUP BY src_label, dst_label ORDER BY bytes DESC LIMIT 10;

ALTER TABLE {{local "flows"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS src_label LowCardinality(String) MATERIALIZED {{srcLabel}} COMMENT 'source as the API names it: namespace/workload, else namespace/pod, else the address' AFTER ingest_batch,
    ADD COLUMN IF NOT EXISTS dst_label LowCardinality(String) MATERIALIZED {{dstLabel}} COMMENT 'destination as the API names it: svc:namespace/name, else namespace/workload, namespace/pod, the address' AFTER src_label,
    ADD COLUMN IF NOT EXISTS verdict_class LowCardinality(String) MATERIALIZED {{verdictClass}} COMMENT 'dropped (a direction denied or rejected), allowed, not_isolated or unknown' AFTER dst_label;
{{if clustered}}
ALTER TABLE {{dist "flows"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS src_label LowCardinality(String) MATERIALIZED {{srcLabel}} COMMENT 'source as the API names it: namespace/workload, else namespace/pod, else the address' AFTER ingest_batch,
    ADD COLUMN IF NOT EXISTS dst_label LowCardinality(String) MATERIALIZED {{dstLabel}} COMMENT 'destination as the API names it: svc:namespace/name, else namespace/workload, namespace/pod, the address' AFTER src_label,
    ADD COLUMN IF NOT EXISTS verdict_class LowCardinality(String) MATERIALIZED {{verdictClass}} COMMENT 'dropped (a direction denied or rejected), allowed, not_isolated or unknown' AFTER dst_label;
{{end}}
ALTER TABLE {{local "flows"}}{{onCluster}}
    ADD PROJECTION IF NOT EXISTS series_1m (
        SELECT toStartOfMinute(flow_end), ip_version, verdict_class, count(), sum(bytes + reverse_bytes)
        GROUP BY toStartOfMinute(flow_end), ip_version, verdict_class
    ),
    ADD PROJECTION IF NOT EXISTS edges_1m (
        SELECT toStartOfMinute(flow_end), ip_version, protocol, src_pod_namespace, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name,
            src_label, dst_label, verdict_class, count(), sum(bytes + reverse_bytes)
        GROUP BY toStartOfMinute(flow_end), ip_version, protocol, src_pod_namespace, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name,
            src_label, dst_label, verdict_class
    ),
    ADD PROJECTION IF NOT EXISTS edges_1h (
        SELECT toStartOfHour(flow_end), ip_version, protocol, src_pod_namespace, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name,
            src_label, dst_label, verdict_class, count(), sum(bytes + reverse_bytes)
        GROUP BY toStartOfHour(flow_end), ip_version, protocol, src_pod_namespace, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name,
            src_label, dst_label, verdict_class
    );

ALTER TABLE {{local "flows"}}{{onCluster}} MATERIALIZE PROJECTION series_1m;

ALTER TABLE {{local "flows"}}{{onCluster}} MATERIALIZE PROJECTION edges_1m;

ALTER TABLE {{local "flows"}}{{onCluster}} MATERIALIZE PROJECTION edges_1h;
