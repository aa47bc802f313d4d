-- 0013: rollup_policy_1m keeps the protocol and destination port.
--
-- The denied-flows report (dualflow audit denied, /api/v1/audit/denied)
-- had no port: the policy rollup it sums grouped by policy, rule, verdict
-- and workloads only, so a denial of 5432/TCP and one of 53/UDP between the
-- same workloads were one row. Two key columns are added:
--
--   protocol  IANA number of the flows (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6,
--             132 SCTP)
--   dst_port  their destination port after DNAT (flows.dst_port: for ICMP
--             and ICMPv6 type*256+code)
--
-- Rows summed before this migration read 0 in both (the reports show them
-- blank); they still count in every sum. Both columns join the end of the
-- SummingMergeTree key in the statement that adds them (ClickHouse only
-- extends a sorting key with columns added in the same ALTER; outside the
-- key a SummingMergeTree would sum them). The materialized views fill them
-- from now on. The hourly projection policy_1h (migration 0010) is rebuilt
-- with them among its keys, so a report grouping by port is still
-- answered from it (ClickHouse answers from a projection only when it
-- holds every column a query needs; ADD PROJECTION IF NOT EXISTS would
-- keep the old one, so it is dropped first). Between the two statements
-- and until the MATERIALIZE mutation finishes, parts without it are read
-- as rows (same answers, slower). The new columns have no DEFAULT clause
-- (they default to 0): ClickHouse refuses a column with a default
-- expression in a sorting key it extends.
--
--   SELECT policy_namespace, policy_name, protocol, dst_port, ip_version, sum(records) AS flows
--   FROM dualflow.rollup_policy_1m
--   WHERE verdict IN ('denied', 'rejected') AND window_start > now() - INTERVAL 1 DAY
--   GROUP BY ALL ORDER BY flows DESC;

ALTER TABLE {{local "rollup_policy_1m"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS protocol UInt8 COMMENT 'IANA protocol number; 0 for rows summed before migration 0013' AFTER dst_workload_name,
    ADD COLUMN IF NOT EXISTS dst_port UInt16 COMMENT 'destination port after DNAT (ICMP: type*256+code); 0 for rows summed before migration 0013' AFTER protocol,
    MODIFY ORDER BY (window_start, ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict, src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port);
{{if clustered}}
ALTER TABLE {{dist "rollup_policy_1m"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS protocol UInt8 COMMENT 'IANA protocol number; 0 for rows summed before migration 0013' AFTER dst_workload_name,
    ADD COLUMN IF NOT EXISTS dst_port UInt16 COMMENT 'destination port after DNAT (ICMP: type*256+code); 0 for rows summed before migration 0013' AFTER protocol;
{{end}}
ALTER TABLE {{local "rollup_policy_1m_ingress_mv"}}{{onCluster}} MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'ingress' AS direction,
    ingress_policy_namespace AS policy_namespace, ingress_policy_name AS policy_name,
    ingress_policy_rule AS policy_rule, ingress_verdict AS verdict, ingress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM {{local "flows"}}
WHERE (ingress_verdict != 'unknown' OR ingress_reported_verdict != 'unknown') AND probe_trace_id = ''
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port;

ALTER TABLE {{local "rollup_policy_1m_egress_mv"}}{{onCluster}} MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'egress' AS direction,
    egress_policy_namespace AS policy_namespace, egress_policy_name AS policy_name,
    egress_policy_rule AS policy_rule, egress_verdict AS verdict, egress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM {{local "flows"}}
WHERE (egress_verdict != 'unknown' OR egress_reported_verdict != 'unknown') AND probe_trace_id = ''
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port;

ALTER TABLE {{local "rollup_policy_1m"}}{{onCluster}}
    DROP PROJECTION IF EXISTS policy_1h;

ALTER TABLE {{local "rollup_policy_1m"}}{{onCluster}}
    ADD PROJECTION IF NOT EXISTS policy_1h (
        SELECT toStartOfHour(window_start), ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
            src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port,
            sum(records), sum(packets), sum(bytes), min(window_start), max(window_start)
        GROUP BY toStartOfHour(window_start), ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
            src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port
    );

ALTER TABLE {{local "rollup_policy_1m"}}{{onCluster}} MATERIALIZE PROJECTION policy_1h;
