-- 0001_flows.sql
CREATE TABLE IF NOT EXISTS dualflow.flows
(
    -- time
    flow_start       DateTime64(3, 'UTC') COMMENT 'first packet of the connection (conntrack start timestamp)',
    flow_end         DateTime64(3, 'UTC') COMMENT 'last packet or export time of this record',
    time_received    DateTime64(3, 'UTC') COMMENT 'when the collector received the record',

    -- connection
    ip_version       UInt8 COMMENT '4 or 6',
    -- Addresses are inserted as IPv6 into the *_in columns (insert-only,
    -- IPv4 mapped as ::ffff:a.b.c.d) and shown as text: a dotted quad for
    -- IPv4, RFC 5952 text for IPv6, '' when absent.
    src_ip_in        IPv6 EPHEMERAL COMMENT 'insert-only: source address as IPv6',
    dst_ip_in        IPv6 EPHEMERAL COMMENT 'insert-only: destination address as IPv6',
    src_ip           String DEFAULT if(src_ip_in = toIPv6('::'), '', if(src_ip_in BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), substring(IPv6NumToString(src_ip_in), 8), IPv6NumToString(src_ip_in))) COMMENT 'source address: dotted quad for IPv4, RFC 5952 text for IPv6',
    dst_ip           String DEFAULT if(dst_ip_in = toIPv6('::'), '', if(dst_ip_in BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), substring(IPv6NumToString(dst_ip_in), 8), IPv6NumToString(dst_ip_in))) COMMENT 'destination address after DNAT (the endpoint actually reached)',
    src_ip_bin       IPv6 MATERIALIZED src_ip_in COMMENT 'src_ip as IPv6 (IPv4 mapped as ::ffff:a.b.c.d), for fast range filters',
    dst_ip_bin       IPv6 MATERIALIZED dst_ip_in COMMENT 'dst_ip as IPv6 (IPv4 mapped as ::ffff:a.b.c.d), for fast range filters',
    src_port         UInt16,
    dst_port         UInt16,
    protocol         UInt8 COMMENT 'IANA protocol number: 6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6, 132 SCTP',
    protocol_name    LowCardinality(String) MATERIALIZED multiIf(protocol = 6, 'TCP', protocol = 17, 'UDP', protocol = 1, 'ICMP', protocol = 58, 'ICMPv6', protocol = 132, 'SCTP', toString(protocol)) COMMENT 'protocol as text',
    service_ip_in    IPv6 EPHEMERAL COMMENT 'insert-only: original destination as IPv6',
    snat_ip_in       IPv6 EPHEMERAL COMMENT 'insert-only: translated source as IPv6',
    service_ip       String DEFAULT if(service_ip_in = toIPv6('::'), '', if(service_ip_in BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), substring(IPv6NumToString(service_ip_in), 8), IPv6NumToString(service_ip_in))) COMMENT 'original destination before DNAT (a Service VIP), empty when not translated',
    service_port     UInt16 COMMENT 'original destination port before DNAT, 0 when not translated',
    snat_ip          String DEFAULT if(snat_ip_in = toIPv6('::'), '', if(snat_ip_in BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), substring(IPv6NumToString(snat_ip_in), 8), IPv6NumToString(snat_ip_in))) COMMENT 'translated source address after SNAT, empty when not translated',
    snat_port        UInt16 COMMENT 'translated source port after SNAT, 0 when not translated',

    -- counters: deltas since the previous record of the same connection; sum these
    packets          UInt64 COMMENT 'packets src→dst since the previous record of this connection',
    bytes            UInt64 COMMENT 'bytes src→dst since the previous record of this connection',
    reverse_packets  UInt64 COMMENT 'packets dst→src since the previous record (RFC 5103)',
    reverse_bytes    UInt64 COMMENT 'bytes dst→src since the previous record (RFC 5103)',
    -- counters: totals since the connection started; do not sum across records
    packets_total         UInt64 COMMENT 'packets src→dst since the connection started',
    bytes_total           UInt64 COMMENT 'bytes src→dst since the connection started',
    reverse_packets_total UInt64 COMMENT 'packets dst→src since the connection started',
    reverse_bytes_total   UInt64 COMMENT 'bytes dst→src since the connection started',

    end_reason       Enum8('unknown' = 0, 'idle_timeout' = 1, 'active_timeout' = 2, 'end_of_flow' = 3, 'forced_end' = 4, 'lack_of_resources' = 5) COMMENT 'IPFIX flowEndReason',
    tcp_state        LowCardinality(String) COMMENT 'conntrack TCP state, empty for other protocols',
    ct_zone          UInt16 COMMENT 'conntrack zone',
    ct_mark          UInt32 COMMENT 'conntrack mark',

    -- exporter
    exporter_ip_in        IPv6 EPHEMERAL COMMENT 'insert-only: exporter address as IPv6',
    exporter_ip           String DEFAULT if(exporter_ip_in = toIPv6('::'), '', if(exporter_ip_in BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), substring(IPv6NumToString(exporter_ip_in), 8), IPv6NumToString(exporter_ip_in))) COMMENT 'address the IPFIX exporter sent from',
    observation_domain_id UInt32 COMMENT 'IPFIX observation domain',
    exporter_node         LowCardinality(String) COMMENT 'node name reported by the exporter',
    source                LowCardinality(String) COMMENT 'conntrack, ovs, or ipfix for a foreign exporter',

    -- Kubernetes: source
    src_pod_namespace   LowCardinality(String),
    src_pod_name        String,
    src_pod_labels      Map(LowCardinality(String), String),
    src_workload_kind   LowCardinality(String) COMMENT 'Deployment, StatefulSet, DaemonSet, Job, CronJob, ReplicaSet, Pod or Node',
    src_workload_name   String,
    src_node            LowCardinality(String),
    src_zone            LowCardinality(String) COMMENT 'topology.kubernetes.io/zone of the source node',
    -- Kubernetes: destination
    dst_pod_namespace   LowCardinality(String),
    dst_pod_name        String,
    dst_pod_labels      Map(LowCardinality(String), String),
    dst_workload_kind   LowCardinality(String),
    dst_workload_name   String,
    dst_node            LowCardinality(String),
    dst_zone            LowCardinality(String),
    dst_service_namespace LowCardinality(String) COMMENT 'Service the flow was addressed to (via service_ip)',
    dst_service_name      String,
    dst_service_port_name LowCardinality(String),
    flow_type        Enum8('unknown' = 0, 'intra_node' = 1, 'inter_node' = 2, 'to_external' = 3, 'from_external' = 4),
    correlation      Enum8('none' = 0, 'merged' = 1, 'source_only' = 2, 'destination_only' = 3) COMMENT 'whether both node halves of the connection were merged',

    -- policy auditing
    ingress_policy_namespace LowCardinality(String),
    ingress_policy_name      LowCardinality(String),
    ingress_policy_rule      Int32 DEFAULT -1 COMMENT 'index in the policy ingress list, -1 when no rule decided',
    ingress_verdict          Enum8('unknown' = 0, 'not_isolated' = 1, 'allowed' = 2, 'denied' = 3, 'rejected' = 4) COMMENT 'evaluated by dualflow',
    ingress_reported_verdict Enum8('unknown' = 0, 'not_isolated' = 1, 'allowed' = 2, 'denied' = 3, 'rejected' = 4) COMMENT 'reported by the datapath',
    ingress_reported_policy  LowCardinality(String),
    egress_policy_namespace  LowCardinality(String),
    egress_policy_name       LowCardinality(String),
    egress_policy_rule       Int32 DEFAULT -1 COMMENT 'index in the policy egress list, -1 when no rule decided',
    egress_verdict           Enum8('unknown' = 0, 'not_isolated' = 1, 'allowed' = 2, 'denied' = 3, 'rejected' = 4),
    egress_reported_verdict  Enum8('unknown' = 0, 'not_isolated' = 1, 'allowed' = 2, 'denied' = 3, 'rejected' = 4),
    egress_reported_policy   LowCardinality(String),
    verdict_mismatch         Bool COMMENT 'a reported verdict disagrees with the evaluated one',

    INDEX idx_src_ip_bin src_ip_bin TYPE minmax GRANULARITY 4,
    INDEX idx_dst_ip_bin dst_ip_bin TYPE minmax GRANULARITY 4
)
ENGINE = MergeTree
PARTITION BY toDate(flow_end)
ORDER BY (toStartOfMinute(flow_end), ip_version, src_pod_namespace, dst_pod_namespace, flow_end)

SETTINGS index_granularity = 8192, non_replicated_deduplication_window = 10000, min_bytes_for_wide_part = 268435456
COMMENT 'one row per exported flow record; sum the delta counters (packets, bytes, reverse_*)';

-- 0002_rollups.sql
CREATE TABLE IF NOT EXISTS dualflow.rollup_pod_to_pod_1m
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
ENGINE = SummingMergeTree
PARTITION BY toDate(window_start)
ORDER BY (window_start, ip_version, src_pod_namespace, src_pod_name, dst_pod_namespace, dst_pod_name, protocol, flow_type, src_workload_kind, src_workload_name, dst_workload_kind, dst_workload_name)

SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'pod-to-pod traffic per minute and IP family';

CREATE MATERIALIZED VIEW IF NOT EXISTS dualflow.rollup_pod_to_pod_1m_mv
TO dualflow.rollup_pod_to_pod_1m AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, protocol, flow_type,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM dualflow.flows
GROUP BY window_start, ip_version, protocol, flow_type,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name;

CREATE TABLE IF NOT EXISTS dualflow.rollup_pod_to_service_1m
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
ENGINE = SummingMergeTree
PARTITION BY toDate(window_start)
ORDER BY (window_start, ip_version, dst_service_namespace, dst_service_name, src_pod_namespace, src_pod_name, protocol, dst_service_port_name, service_port, src_workload_kind, src_workload_name)

SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'pod-to-Service traffic per minute and IP family (flows addressed to a Service)';

CREATE MATERIALIZED VIEW IF NOT EXISTS dualflow.rollup_pod_to_service_1m_mv
TO dualflow.rollup_pod_to_service_1m AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, protocol,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_service_namespace, dst_service_name, dst_service_port_name, service_port,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM dualflow.flows
WHERE dst_service_name != ''
GROUP BY window_start, ip_version, protocol,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_service_namespace, dst_service_name, dst_service_port_name, service_port;

CREATE TABLE IF NOT EXISTS dualflow.rollup_node_to_node_1m
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
ENGINE = SummingMergeTree
PARTITION BY toDate(window_start)
ORDER BY (window_start, ip_version, src_node, dst_node, src_zone, dst_zone, flow_type)

SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'node-to-node (and zone-to-zone) traffic per minute and IP family';

CREATE MATERIALIZED VIEW IF NOT EXISTS dualflow.rollup_node_to_node_1m_mv
TO dualflow.rollup_node_to_node_1m AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version,
    src_node, dst_node, src_zone, dst_zone, flow_type,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM dualflow.flows
GROUP BY window_start, ip_version, src_node, dst_node, src_zone, dst_zone, flow_type;

CREATE TABLE IF NOT EXISTS dualflow.rollup_policy_1m
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
ENGINE = SummingMergeTree
PARTITION BY toDate(window_start)
ORDER BY (window_start, ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict, src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name)

SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'policy decisions per minute, IP family and direction';

CREATE MATERIALIZED VIEW IF NOT EXISTS dualflow.rollup_policy_1m_ingress_mv
TO dualflow.rollup_policy_1m AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'ingress' AS direction,
    ingress_policy_namespace AS policy_namespace, ingress_policy_name AS policy_name,
    ingress_policy_rule AS policy_rule, ingress_verdict AS verdict, ingress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM dualflow.flows
WHERE ingress_verdict != 'unknown' OR ingress_reported_verdict != 'unknown'
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name;

CREATE MATERIALIZED VIEW IF NOT EXISTS dualflow.rollup_policy_1m_egress_mv
TO dualflow.rollup_policy_1m AS
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'egress' AS direction,
    egress_policy_namespace AS policy_namespace, egress_policy_name AS policy_name,
    egress_policy_rule AS policy_rule, egress_verdict AS verdict, egress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM dualflow.flows
WHERE egress_verdict != 'unknown' OR egress_reported_verdict != 'unknown'
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name;

-- 0004_traceflows.sql
CREATE TABLE IF NOT EXISTS dualflow.traceflows
(
    trace_id        String COMMENT 'id returned by POST /api/v1/traceflows',
    started         DateTime64(3, 'UTC'),
    ended           DateTime64(3, 'UTC'),
    phase           LowCardinality(String) COMMENT 'succeeded or failed (the whole trace)',
    phase_reason    String,
    source_pod      String COMMENT 'namespace/name',
    destination     String COMMENT 'pod:ns/name:port, svc:ns/name:port or ip:addr:port',
    family          LowCardinality(String) COMMENT 'ipv4 or ipv6',
    outcome         LowCardinality(String) COMMENT 'delivered, dropped, rejected, no-address, timeout or error',
    outcome_reason  String,
    protocol        LowCardinality(String) COMMENT 'TCP, UDP, ICMP or ICMPv6',
    src_ip          String COMMENT 'probe source: dotted quad or RFC 5952 text, empty when not sent',
    dst_ip          String COMMENT 'probe destination before any DNAT',
    src_port        UInt16 COMMENT 'or ICMP echo id',
    dst_port        UInt16,
    translated_dst  String COMMENT 'destination after DNAT (addr:port), empty when not translated',
    delivered_pod   String COMMENT 'namespace/name of the pod the probe reached',
    last_node       String COMMENT 'last node that saw the probe',
    drop_policy     String COMMENT 'policy (namespace/name, comma-separated) of a policy drop',
    drop_rule       String COMMENT 'rule name of a policy drop, e.g. drop/ingress/ns/pod or ns/policy/ingress/0',
    duration_ms     Float64,
    observations    String COMMENT 'JSON array of the observations in path order'
)
ENGINE = MergeTree
PARTITION BY toDate(started)
ORDER BY (started, trace_id, family)

COMMENT 'traceflow results, one row per trace and family';

-- 0005_flows_merge_width.sql
ALTER TABLE dualflow.flows MODIFY SETTING merge_selector_base = 20;

-- 0006_flows_k8s_view_stale.sql
ALTER TABLE dualflow.flows
    ADD COLUMN IF NOT EXISTS k8s_view_stale Bool DEFAULT false COMMENT 'enriched while the view of the Kubernetes API was stale: names may be out of date' AFTER verdict_mismatch;

-- 0007_cluster_sharding.sql
-- 0008_flows_ingest_batch.sql
ALTER TABLE dualflow.flows
    ADD COLUMN IF NOT EXISTS ingest_batch UInt64 MATERIALIZED if(getSetting('insert_deduplication_token') = '', 0, cityHash64(getSetting('insert_deduplication_token'))) COMMENT 'cityHash64 of the insert_deduplication_token of the insert that stored the row (0: none); the collector checks its journal against it after a crash' AFTER k8s_view_stale;

-- 0009_flows_edge_projections.sql
ALTER TABLE dualflow.flows
    ADD COLUMN IF NOT EXISTS src_label LowCardinality(String) MATERIALIZED multiIf(src_workload_name != '', concat(src_pod_namespace, '/', src_workload_name), src_pod_name != '', concat(src_pod_namespace, '/', src_pod_name), src_ip) COMMENT 'source as the API names it: namespace/workload, else namespace/pod, else the address' AFTER ingest_batch,
    ADD COLUMN IF NOT EXISTS dst_label LowCardinality(String) MATERIALIZED multiIf(dst_service_name != '', concat('svc:', dst_service_namespace, '/', dst_service_name), dst_workload_name != '', concat(dst_pod_namespace, '/', dst_workload_name), dst_pod_name != '', concat(dst_pod_namespace, '/', dst_pod_name), dst_ip) COMMENT 'destination as the API names it: svc:namespace/name, else namespace/workload, namespace/pod, the address' AFTER src_label,
    ADD COLUMN IF NOT EXISTS verdict_class LowCardinality(String) MATERIALIZED multiIf(ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected'), 'dropped', ingress_verdict = 'allowed' OR egress_verdict = 'allowed', 'allowed', ingress_verdict = 'not_isolated' OR egress_verdict = 'not_isolated', 'not_isolated', 'unknown') COMMENT 'dropped (a direction denied or rejected), allowed, not_isolated or unknown' AFTER dst_label;

ALTER TABLE dualflow.flows
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

ALTER TABLE dualflow.flows MATERIALIZE PROJECTION series_1m;

ALTER TABLE dualflow.flows MATERIALIZE PROJECTION edges_1m;

ALTER TABLE dualflow.flows MATERIALIZE PROJECTION edges_1h;

-- 0010_rollup_policy_hourly.sql
ALTER TABLE dualflow.rollup_policy_1m
    MODIFY SETTING deduplicate_merge_projection_mode = 'rebuild';

ALTER TABLE dualflow.rollup_policy_1m
    ADD PROJECTION IF NOT EXISTS policy_1h (
        SELECT toStartOfHour(window_start), ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
            src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
            sum(records), sum(packets), sum(bytes), min(window_start), max(window_start)
        GROUP BY toStartOfHour(window_start), ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
            src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name
    );

ALTER TABLE dualflow.rollup_policy_1m MATERIALIZE PROJECTION policy_1h;

-- 0011_traceflows_ttl.sql
-- 0012_flows_probe_trace_id.sql
ALTER TABLE dualflow.flows
    ADD COLUMN IF NOT EXISTS probe_trace_id LowCardinality(String) DEFAULT '' COMMENT 'id of the traceflow trace whose probe this row is; empty for ordinary traffic' AFTER k8s_view_stale,
    ADD COLUMN IF NOT EXISTS is_probe Bool MATERIALIZED probe_trace_id != '' COMMENT 'the row is a traceflow probe''s (probe_trace_id set)' AFTER verdict_class;

ALTER TABLE dualflow.rollup_pod_to_pod_1m_mv MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, protocol, flow_type,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM dualflow.flows
WHERE probe_trace_id = ''
GROUP BY window_start, ip_version, protocol, flow_type,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name;

ALTER TABLE dualflow.rollup_pod_to_service_1m_mv MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, protocol,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_service_namespace, dst_service_name, dst_service_port_name, service_port,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM dualflow.flows
WHERE dst_service_name != '' AND probe_trace_id = ''
GROUP BY window_start, ip_version, protocol,
    src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
    dst_service_namespace, dst_service_name, dst_service_port_name, service_port;

ALTER TABLE dualflow.rollup_node_to_node_1m_mv MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version,
    src_node, dst_node, src_zone, dst_zone, flow_type,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes,
    sum(reverse_packets) AS reverse_packets, sum(reverse_bytes) AS reverse_bytes
FROM dualflow.flows
WHERE probe_trace_id = ''
GROUP BY window_start, ip_version, src_node, dst_node, src_zone, dst_zone, flow_type;

ALTER TABLE dualflow.rollup_policy_1m_ingress_mv MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'ingress' AS direction,
    ingress_policy_namespace AS policy_namespace, ingress_policy_name AS policy_name,
    ingress_policy_rule AS policy_rule, ingress_verdict AS verdict, ingress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM dualflow.flows
WHERE (ingress_verdict != 'unknown' OR ingress_reported_verdict != 'unknown') AND probe_trace_id = ''
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name;

ALTER TABLE dualflow.rollup_policy_1m_egress_mv MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'egress' AS direction,
    egress_policy_namespace AS policy_namespace, egress_policy_name AS policy_name,
    egress_policy_rule AS policy_rule, egress_verdict AS verdict, egress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM dualflow.flows
WHERE (egress_verdict != 'unknown' OR egress_reported_verdict != 'unknown') AND probe_trace_id = ''
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name;

ALTER TABLE dualflow.flows
    DROP PROJECTION IF EXISTS series_1m,
    DROP PROJECTION IF EXISTS edges_1m,
    DROP PROJECTION IF EXISTS edges_1h;

ALTER TABLE dualflow.flows
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

ALTER TABLE dualflow.flows MATERIALIZE PROJECTION series_1m;

ALTER TABLE dualflow.flows MATERIALIZE PROJECTION edges_1m;

ALTER TABLE dualflow.flows MATERIALIZE PROJECTION edges_1h;

-- 0013_rollup_policy_ports.sql
ALTER TABLE dualflow.rollup_policy_1m
    ADD COLUMN IF NOT EXISTS protocol UInt8 COMMENT 'IANA protocol number; 0 for rows summed before migration 0013' AFTER dst_workload_name,
    ADD COLUMN IF NOT EXISTS dst_port UInt16 COMMENT 'destination port after DNAT (ICMP: type*256+code); 0 for rows summed before migration 0013' AFTER protocol,
    MODIFY ORDER BY (window_start, ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict, src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port);

ALTER TABLE dualflow.rollup_policy_1m_ingress_mv MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'ingress' AS direction,
    ingress_policy_namespace AS policy_namespace, ingress_policy_name AS policy_name,
    ingress_policy_rule AS policy_rule, ingress_verdict AS verdict, ingress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM dualflow.flows
WHERE (ingress_verdict != 'unknown' OR ingress_reported_verdict != 'unknown') AND probe_trace_id = ''
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port;

ALTER TABLE dualflow.rollup_policy_1m_egress_mv MODIFY QUERY
SELECT
    toStartOfMinute(flow_end) AS window_start, ip_version, 'egress' AS direction,
    egress_policy_namespace AS policy_namespace, egress_policy_name AS policy_name,
    egress_policy_rule AS policy_rule, egress_verdict AS verdict, egress_reported_verdict AS reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port,
    count() AS records, sum(packets) AS packets, sum(bytes) AS bytes
FROM dualflow.flows
WHERE (egress_verdict != 'unknown' OR egress_reported_verdict != 'unknown') AND probe_trace_id = ''
GROUP BY window_start, ip_version, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
    src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port;

ALTER TABLE dualflow.rollup_policy_1m
    DROP PROJECTION IF EXISTS policy_1h;

ALTER TABLE dualflow.rollup_policy_1m
    ADD PROJECTION IF NOT EXISTS policy_1h (
        SELECT toStartOfHour(window_start), ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
            src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port,
            sum(records), sum(packets), sum(bytes), min(window_start), max(window_start)
        GROUP BY toStartOfHour(window_start), ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
            src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port
    );

ALTER TABLE dualflow.rollup_policy_1m MATERIALIZE PROJECTION policy_1h;

-- 0014_flows_observed_projection.sql
ALTER TABLE dualflow.flows
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

ALTER TABLE dualflow.flows MATERIALIZE PROJECTION observed_1h;

