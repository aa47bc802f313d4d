-- 0004: traceflow results, one row per trace and IP family.
--
-- Written by traceflow.Store when a trace finishes (package traceflow). The
-- path is kept as JSON (observations, in path order); the columns beside it
-- are what lists and filters need: outcome, family, endpoints, and for a
-- policy drop the policy and rule.

CREATE TABLE IF NOT EXISTS {{local "traceflows"}}{{onCluster}}
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
ENGINE = {{engine "MergeTree"}}
PARTITION BY toDate(started)
ORDER BY (started, trace_id, family)
{{ttl "started"}}
COMMENT 'traceflow results, one row per trace and family';

{{distributed "traceflows" "rand()"}}
