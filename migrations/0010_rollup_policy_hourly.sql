-- 0010: an hourly aggregate projection of rollup_policy_1m, so the audit's
-- denied-flows and unused-rules reports over a day sum a few hundred
-- thousand rows instead of millions.
--
-- rollup_policy_1m barely aggregates at a busy cluster's density (17.2M
-- rows for 45.5M flows in docs/scale.md: each minute has most of the
-- policy, workload and family combinations), and its sort key starts with
-- the minute, so /audit/denied over 24 hours read 5.4M rows. The
-- projection sums the same columns per hour (records, packets, bytes, and
-- the first and last minute). The reports read whole hours through
-- toStartOfHour(window_start) and the minutes at either end as rows
-- (collector/audit/reports.go); ClickHouse answers from the projection
-- only when it gives the rows' answer.
--
-- rollup_policy_1m is a SummingMergeTree: its merges sum rows, so the
-- projection of a merged part is rebuilt from the merged rows
-- (deduplicate_merge_projection_mode = 'rebuild'; without the setting
-- ClickHouse refuses a projection on such a table).

ALTER TABLE {{local "rollup_policy_1m"}}{{onCluster}}
    MODIFY SETTING deduplicate_merge_projection_mode = 'rebuild';

ALTER TABLE {{local "rollup_policy_1m"}}{{onCluster}}
    ADD PROJECTION IF NOT EXISTS policy_1h (
        SELECT toStartOfHour(window_start), ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
            src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name,
            sum(records), sum(packets), sum(bytes), min(window_start), max(window_start)
        GROUP BY toStartOfHour(window_start), ip_version, direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
            src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name
    );

ALTER TABLE {{local "rollup_policy_1m"}}{{onCluster}} MATERIALIZE PROJECTION policy_1h;
