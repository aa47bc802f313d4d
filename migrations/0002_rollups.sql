-- 0002: per-minute rollups fed by materialized views on flows.
--
-- Every rollup sums only the delta counters (packets, bytes, reverse_packets,
-- reverse_bytes), so long connections exported at each active timeout are
-- never double counted. Rollups are SummingMergeTree: rows with the same key
-- are summed at merge time, so always aggregate with sum() ... GROUP BY when
-- you query them.

CREATE TABLE IF NOT EXISTS {{local "rollup_pod_to_pod_1m"}}{{onCluster}}
(
    window_start      DateTime('UTC') COMMENT 'start of the one-minute window (flow_end)',
    ip_version        UInt8,
    protocol          UInt8,
    flow_type         Enum8('unknown' = 0, 'intra_node' = 1, 'inter_node' = 2, 'to_external' = 3, 'from_external' = 4),
    src_pod_namespace LowCardinality(String),
    src_pod_name      String,
    src_workload_kind LowCardinality(String),
    src_workload_name String,
    dst_pod_namespace LowCardinality(String),
    dst_pod_name      String,
    dst_workload_kind LowCardinality(String),
    dst_workload_name String,
    records           UInt64 COMMENT 'flow records in the window',
    packets           UInt64,
    bytes             UInt64,
    reverse_packets   UInt64,
    reverse_bytes     UInt64
)
ENGINE = {{engine "SummingMergeTree"}}
PARTITION BY toDate(window_start)
ORDER BY (window_start, ip_version, src_pod_namespace, src_pod_name, dst_pod_namespace, dst_pod_name, protocol, flow_type, src_workload_kind, src_workload_name, dst_workload_kind, dst_workload_name)
{{ttl "window_start"}}
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'pod-to-pod traffic per minute and IP family';

CREATE MATERIALIZED VIEW IF NOT EXISTS {{local "rollup_pod_to_pod_1m_mv"}}{{onCluster}}
TO {{local "rollup_pod_to_pod_1m"}} AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, protocol, flow_type,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM {{local "flows"}}
GROUP BY window_start, ip_version, protocol, flow_type,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name;

CREATE TABLE IF NOT EXISTS {{local "rollup_pod_to_service_1m"}}{{onCluster}}
(
    window_start          DateTime('UTC'),
    ip_version            UInt8,
    protocol              UInt8,
    src_pod_namespace     LowCardinality(String),
    src_pod_name          String,
    src_workload_kind     LowCardinality(String),
    src_workload_name     String,
    dst_service_namespace LowCardinality(String),
    dst_service_name      String,
    dst_service_port_name LowCardinality(String),
    service_port          UInt16,
    records               UInt64,
    packets               UInt64,
    bytes                 UInt64,
    reverse_packets       UInt64,
    reverse_bytes         UInt64
)
ENGINE = {{engine "SummingMergeTree"}}
PARTITION BY toDate(window_start)
ORDER BY (window_start, ip_version, dst_service_namespace, dst_service_name, src_pod_namespace, src_pod_name, protocol, dst_service_port_name, service_port, src_workload_kind, src_workload_name)
{{ttl "window_start"}}
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'pod-to-Service traffic per minute and IP family (flows addressed to a Service)';

CREATE MATERIALIZED VIEW IF NOT EXISTS {{local "rollup_pod_to_service_1m_mv"}}{{onCluster}}
TO {{local "rollup_pod_to_service_1m"}} AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, protocol,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_service_namespace, dst_service_name, dst_service_port_name, service_port,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM {{local "flows"}}
WHERE dst_service_name != ''
GROUP BY window_start, ip_version, protocol,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_service_namespace, dst_service_name, dst_service_port_name, service_port;

CREATE TABLE IF NOT EXISTS {{local "rollup_node_to_node_1m"}}{{onCluster}}
(
    window_start    DateTime('UTC'),
    ip_version      UInt8,
    src_node        LowCardinality(String),
    dst_node        LowCardinality(String),
    src_zone        LowCardinality(String),
    dst_zone        LowCardinality(String),
    flow_type       Enum8('unknown' = 0, 'intra_node' = 1, 'inter_node' = 2, 'to_external' = 3, 'from_external' = 4),
    records         UInt64,
    packets         UInt64,
    bytes           UInt64,
    reverse_packets UInt64,
    reverse_bytes   UInt64
)
ENGINE = {{engine "SummingMergeTree"}}
PARTITION BY toDate(window_start)
ORDER BY (window_start, ip_version, src_node, dst_node, src_zone, dst_zone, flow_type)
{{ttl "window_start"}}
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'node-to-node (and zone-to-zone) traffic per minute and IP family';

CREATE MATERIALIZED VIEW IF NOT EXISTS {{local "rollup_node_to_node_1m_mv"}}{{onCluster}}
TO {{local "rollup_node_to_node_1m"}} AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version,
    src_node, dst_node, src_zone, dst_zone, flow_type,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM {{local "flows"}}
GROUP BY window_start, ip_version, src_node, dst_node, src_zone, dst_zone, flow_type;

CREATE TABLE IF NOT EXISTS {{local "rollup_policy_1m"}}{{onCluster}}
(
    window_start      DateTime('UTC'),
    ip_version        UInt8,
    direction         Enum8('ingress' = 1, 'egress' = 2),
    policy_namespace  LowCardinality(String),
    policy_name       LowCardinality(String),
    policy_rule       Int32,
    verdict           Enum8('unknown' = 0, 'not_isolated' = 1, 'allowed' = 2, 'denied' = 3, 'rejected' = 4),
    reported_verdict  Enum8('unknown' = 0, 'not_isolated' = 1, 'allowed' = 2, 'denied' = 3, 'rejected' = 4),
    src_pod_namespace LowCardinality(String),
    src_workload_name String,
    dst_pod_namespace LowCardinality(String),
    dst_workload_name String,
    records           UInt64,
    packets           UInt64,
    bytes             UInt64
)
ENGINE = {{engine "SummingMergeTree"}}
PARTITION BY toDate(window_start)
ORDER BY (window_start, ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict, src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name)
{{ttl "window_start"}}
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'policy decisions per minute, IP family and direction';

CREATE MATERIALIZED VIEW IF NOT EXISTS {{local "rollup_policy_1m_ingress_mv"}}{{onCluster}}
TO {{local "rollup_policy_1m"}} AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'ingress' AS direction,
    ingress_policy_namespace AS policy_namespace, ingress_policy_name AS policy_name,
    ingress_policy_rule AS policy_rule, ingress_verdict AS verdict, ingress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM {{local "flows"}}
WHERE ingress_verdict != 'unknown' OR ingress_reported_verdict != 'unknown'
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name;

CREATE MATERIALIZED VIEW IF NOT EXISTS {{local "rollup_policy_1m_egress_mv"}}{{onCluster}}
TO {{local "rollup_policy_1m"}} AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'egress' AS direction,
    egress_policy_namespace AS policy_namespace, egress_policy_name AS policy_name,
    egress_policy_rule AS policy_rule, egress_verdict AS verdict, egress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM {{local "flows"}}
WHERE egress_verdict != 'unknown' OR egress_reported_verdict != 'unknown'
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name;

{{distributed "rollup_pod_to_pod_1m" "rand()"}}

{{distributed "rollup_pod_to_service_1m" "rand()"}}

{{distributed "rollup_node_to_node_1m" "rand()"}}

{{distributed "rollup_policy_1m" "rand()"}}
