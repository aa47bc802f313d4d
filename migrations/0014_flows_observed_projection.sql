-- 0014: an hourly aggregate projection of flows for the observed flow
-- groups that policy recommendations are built from (issue 38: a cluster
-- of 2,000 workloads with 10M flow records in the window).
--
-- The audit's observed flows (collector/audit/observed.go, read by
-- `dualflow policy recommend` and GET /api/v1/policy/recommend) group a
-- window's records by both ends (address, pod namespace and name,
-- workload kind and name), protocol, destination port, family and the
-- Service addressed, and count the allowed, denied and probe records of
-- each group. Over every row that grouping cost about a CPU-second per
-- million records. The projection observed_1h sums the same three counts
-- per hour and group:
--
--   allowed  countIf(NOT is_probe AND NOT blocked)
--   denied   countIf(NOT is_probe AND blocked)
--   probes   countIf(is_probe)
--
-- where blocked is a side's evaluated or reported verdict denied or
-- rejected. The reader asks for whole hours through
-- toStartOfHour(flow_end) and reads the partial hours at either end of a
-- window as rows; ClickHouse answers from the projection only when it
-- gives the rows' own answer, so the groups and counts are the same
-- either way. Parts written before this migration are covered once the
-- MATERIALIZE PROJECTION mutation below finishes, and are read as rows
-- until then (same answers, slower). Inserts and merges of flows compute
-- it as they compute the projections of migration 0009.
--
--   SELECT src_ip, dst_ip, protocol, dst_port, ip_version, src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
--          dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name, service_port,
--          countIf(NOT is_probe AND NOT (ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected') OR
--                  ingress_reported_verdict IN ('denied', 'rejected') OR egress_reported_verdict IN ('denied', 'rejected'))) AS allowed
--   FROM dualflow.flows
--   WHERE toStartOfHour(flow_end) >= toStartOfHour(now()) - INTERVAL 24 HOUR
--   GROUP BY ALL ORDER BY allowed DESC LIMIT 10;

ALTER TABLE {{local "flows"}}{{onCluster}}
    ADD PROJECTION IF NOT EXISTS observed_1h (
        SELECT toStartOfHour(flow_end), src_ip, dst_ip, protocol, dst_port, ip_version,
            src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name,
            dst_service_namespace, dst_service_name, service_port,
            countIf(NOT is_probe AND NOT (ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected') OR ingress_reported_verdict IN ('denied', 'rejected') OR egress_reported_verdict IN ('denied', 'rejected'))),
            countIf(NOT is_probe AND (ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected') OR ingress_reported_verdict IN ('denied', 'rejected') OR egress_reported_verdict IN ('denied', 'rejected'))),
            countIf(is_probe)
        GROUP BY toStartOfHour(flow_end), src_ip, dst_ip, protocol, dst_port, ip_version,
            src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name,
            dst_service_namespace, dst_service_name, service_port
    );

ALTER TABLE {{local "flows"}}{{onCluster}} MATERIALIZE PROJECTION observed_1h;
