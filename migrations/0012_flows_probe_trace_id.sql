-- 0012: probe_trace_id marks the rows of traceflow probes.
--
-- A trace sends a probe packet from a pod, and the exporters report it as
-- they report any connection: every trace added a row that the map drew
-- as a (often dropped) edge, the audit counted as a denied flow and the
-- charts as traffic, and each reachability cell clicked sent a dual
-- trace. The collector now knows the probes its trace controller sent
-- (tuple and time, kept a few minutes past each trace) and writes the
-- trace's id on the rows of their records. Probes sent by another
-- collector (sharded collectors) or before a restart are not known, and
-- their rows read ''.
--
--   probe_trace_id  the trace's id ('tf-…'), '' for ordinary traffic and
--                   for rows written before this migration
--   is_probe        probe_trace_id != '' (MATERIALIZED, not shown by
--                   SELECT *): what readers filter on
--
-- Everything that sums traffic leaves probe rows out: the rollups'
-- materialized views from now on (rows summed before stay), and the
-- projections of migration 0009, rebuilt with is_probe among their keys
-- so that the web API's default filter (NOT is_probe) is still answered
-- from them. Until the MATERIALIZE mutations below finish, parts without
-- the new projections are read as rows (same answers, slower).
--
--   SELECT probe_trace_id, ip_version, src_ip, dst_ip, dst_port FROM dualflow.flows WHERE is_probe;

ALTER TABLE {{local "flows"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS probe_trace_id LowCardinality(String) DEFAULT '' COMMENT 'id of the traceflow trace whose probe this row is; empty for ordinary traffic' AFTER k8s_view_stale,
    ADD COLUMN IF NOT EXISTS is_probe Bool MATERIALIZED probe_trace_id != '' COMMENT 'the row is a traceflow probe''s (probe_trace_id set)' AFTER verdict_class;
{{if clustered}}
ALTER TABLE {{dist "flows"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS probe_trace_id LowCardinality(String) DEFAULT '' COMMENT 'id of the traceflow trace whose probe this row is; empty for ordinary traffic' AFTER k8s_view_stale,
    ADD COLUMN IF NOT EXISTS is_probe Bool MATERIALIZED probe_trace_id != '' COMMENT 'the row is a traceflow probe''s (probe_trace_id set)' AFTER verdict_class;
{{end}}
ALTER TABLE {{local "rollup_pod_to_pod_1m_mv"}}{{onCluster}} MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, protocol, flow_type,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM {{local "flows"}}
WHERE probe_trace_id = ''
GROUP BY window_start, ip_version, protocol, flow_type,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name;

ALTER TABLE {{local "rollup_pod_to_service_1m_mv"}}{{onCluster}} MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, protocol,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_service_namespace, dst_service_name, dst_service_port_name, service_port,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM {{local "flows"}}
WHERE dst_service_name != '' AND probe_trace_id = ''
GROUP BY window_start, ip_version, protocol,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_service_namespace, dst_service_name, dst_service_port_name, service_port;

ALTER TABLE {{local "rollup_node_to_node_1m_mv"}}{{onCluster}} MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version,
    src_node, dst_node, src_zone, dst_zone, flow_type,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM {{local "flows"}}
WHERE probe_trace_id = ''
GROUP BY window_start, ip_version, src_node, dst_node, src_zone, dst_zone, flow_type;

ALTER TABLE {{local "rollup_policy_1m_ingress_mv"}}{{onCluster}} MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'ingress' AS direction,
    ingress_policy_namespace AS policy_namespace, ingress_policy_name AS policy_name,
    ingress_policy_rule AS policy_rule, ingress_verdict AS verdict, ingress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM {{local "flows"}}
WHERE (ingress_verdict != 'unknown' OR ingress_reported_verdict != 'unknown') AND probe_trace_id = ''
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name;

ALTER TABLE {{local "rollup_policy_1m_egress_mv"}}{{onCluster}} MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'egress' AS direction,
    egress_policy_namespace AS policy_namespace, egress_policy_name AS policy_name,
    egress_policy_rule AS policy_rule, egress_verdict AS verdict, egress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM {{local "flows"}}
WHERE (egress_verdict != 'unknown' OR egress_reported_verdict != 'unknown') AND probe_trace_id = ''
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name;

ALTER TABLE {{local "flows"}}{{onCluster}}
    DROP PROJECTION IF EXISTS series_1m,
    DROP PROJECTION IF EXISTS edges_1m,
    DROP PROJECTION IF EXISTS edges_1h;

ALTER TABLE {{local "flows"}}{{onCluster}}
    ADD PROJECTION IF NOT EXISTS series_1m (
        SELECT toStartOfMinute(flow_end), ip_version, is_probe, verdict_class, count(), sum(bytes + reverse_bytes)
        GROUP BY toStartOfMinute(flow_end), ip_version, is_probe, verdict_class
    ),
    ADD PROJECTION IF NOT EXISTS edges_1m (
        SELECT toStartOfMinute(flow_end), ip_version, is_probe, protocol, src_pod_namespace, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name,
            src_label, dst_label, verdict_class, count(), sum(bytes + reverse_bytes)
        GROUP BY toStartOfMinute(flow_end), ip_version, is_probe, protocol, src_pod_namespace, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name,
            src_label, dst_label, verdict_class
    ),
    ADD PROJECTION IF NOT EXISTS edges_1h (
        SELECT toStartOfHour(flow_end), ip_version, is_probe, protocol, src_pod_namespace, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name,
            src_label, dst_label, verdict_class, count(), sum(bytes + reverse_bytes)
        GROUP BY toStartOfHour(flow_end), ip_version, is_probe, protocol, src_pod_namespace, src_workload_kind, src_workload_name,
            dst_pod_namespace, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name,
            src_label, dst_label, verdict_class
    );

ALTER TABLE {{local "flows"}}{{onCluster}} MATERIALIZE PROJECTION series_1m;

ALTER TABLE {{local "flows"}}{{onCluster}} MATERIALIZE PROJECTION edges_1m;

ALTER TABLE {{local "flows"}}{{onCluster}} MATERIALIZE PROJECTION edges_1h;
