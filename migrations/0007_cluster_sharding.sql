-- 0007: the cluster form, completed for operation (docs/cluster.md).
--
-- Single node: this migration renders to nothing and is only recorded.
--
-- Cluster (--clickhouse.cluster NAME):
--
-- 1. flows and traceflows, the Distributed tables rows are inserted
--    through, were sharded by rand(). A collector retries an ambiguous
--    insert with the same insert_deduplication_token; with rand() the
--    retry splits the batch differently: a shard that had stored its
--    first block drops its new, different block as a duplicate, while the
--    shards that had failed store theirs, so some rows are lost and others
--    stored twice (on two shards). They are recreated with the
--    deterministic keys of migrations.ShardingKeys:
--      flows       cityHash64(src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name)
--      traceflows  cityHash64(trace_id)
--    The flows key keeps a namespace/workload pair on one shard, so each
--    key of rollup_pod_to_pod_1m and rollup_policy_1m (which include both
--    namespaces and workloads) is summed on one shard, and the records of
--    one connection stay together. A Distributed table holds no rows:
--    pending background sends are flushed first (this fails, and the
--    migration is retried at the next start, while a shard is unreachable),
--    then CREATE OR REPLACE (which flushes the old table again, since
--    ClickHouse 21.8) swaps the table atomically with the same name
--    and columns (those of the local table, including 0006's). The rollup
--    Distributed tables keep rand(): nothing inserts through them.
--
-- 2. The deduplication window of each local table, per shard: 10000
--    blocks, as non_replicated_deduplication_window on a single node, and
--    7 days instead of ClickHouse's default of one hour
--    (replicated_deduplication_window_seconds = 3600 in 26.x), so a batch
--    spooled through an outage of more than an hour is still stored once.
--    Keeper holds at most 10000 block hashes per table and shard.
--
-- 3. src_ip_bin and dst_ip_bin were MATERIALIZED from the EPHEMERAL
--    src_ip_in and dst_ip_in. An insert through a Distributed table
--    computes the DEFAULT columns (src_ip, dst_ip) on the server that
--    receives it and drops the EPHEMERAL ones before sending the rows to
--    the shards, so each shard computed its *_ip_bin from an absent column:
--    '::' in every row, and address filters on *_ip_bin (the web UI's, the
--    documented range queries) found nothing. On the shards they are now
--    computed from the text columns, which the rows carry; existing rows
--    keep their value until rewritten (docs/cluster.md: MATERIALIZE
--    COLUMN). This comes before the Distributed flows is recreated, so that
--    its copy of the columns matches.
--
-- TTL stays on the local tables (0001-0004, and the runner's TTL
-- reconciliation); a Distributed table has none.
{{if clustered}}
ALTER TABLE {{local "flows"}}{{onCluster}}
    MODIFY COLUMN src_ip_bin IPv6 MATERIALIZED toIPv6OrDefault(src_ip) COMMENT 'src_ip as IPv6 (IPv4 mapped as ::ffff:a.b.c.d), for fast range filters',
    MODIFY COLUMN dst_ip_bin IPv6 MATERIALIZED toIPv6OrDefault(dst_ip) COMMENT 'dst_ip as IPv6 (IPv4 mapped as ::ffff:a.b.c.d), for fast range filters';

SYSTEM FLUSH DISTRIBUTED {{dist "flows"}}{{onCluster}};

{{replaceDistributed "flows"}}

SYSTEM FLUSH DISTRIBUTED {{dist "traceflows"}}{{onCluster}};

{{replaceDistributed "traceflows"}}

ALTER TABLE {{local "flows"}}{{onCluster}} MODIFY SETTING replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800;
ALTER TABLE {{local "rollup_pod_to_pod_1m"}}{{onCluster}} MODIFY SETTING replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800;
ALTER TABLE {{local "rollup_pod_to_service_1m"}}{{onCluster}} MODIFY SETTING replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800;
ALTER TABLE {{local "rollup_node_to_node_1m"}}{{onCluster}} MODIFY SETTING replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800;
ALTER TABLE {{local "rollup_policy_1m"}}{{onCluster}} MODIFY SETTING replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800;
ALTER TABLE {{local "traceflows"}}{{onCluster}} MODIFY SETTING replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800;
{{end}}
