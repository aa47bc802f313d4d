-- 0008: ingest_batch names the insert each row came in with, so that a
-- collector restarting after a crash can tell which of its batches were
-- stored.
--
-- The collector journals every received record in its write-ahead log and
-- acknowledges it there once its batch is stored. A collector killed
-- between the end of an insert and that acknowledgement used to replay the
-- batch at its next start and store it twice. It now journals each batch's
-- insert_deduplication_token before inserting it; at the next start it
-- looks the tokens of unacknowledged batches up here and replays only the
-- batches that are not stored.
--
-- The column is computed by ClickHouse from the insert's own
-- insert_deduplication_token setting (cityHash64 of it), so every way of
-- inserting (Native blocks, RowBinary, clickhouse-go, the HTTP interface,
-- an insert through a Distributed table, which forwards its settings to
-- the shards) fills it without the collector sending a column. Rows
-- inserted without a token, and rows written before this migration, read
-- 0. It is MATERIALIZED: SELECT * does not show it; name it.
--
--   SELECT ingest_batch, count() FROM dualflow.flows
--   WHERE flow_end > now() - INTERVAL 10 MINUTE GROUP BY ingest_batch;

ALTER TABLE {{local "flows"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS ingest_batch UInt64 MATERIALIZED {{ingestBatch}} COMMENT 'cityHash64 of the insert_deduplication_token of the insert that stored the row (0: none); the collector checks its journal against it after a crash' AFTER k8s_view_stale;
{{if clustered}}
ALTER TABLE {{dist "flows"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS ingest_batch UInt64 MATERIALIZED {{ingestBatch}} COMMENT 'cityHash64 of the insert_deduplication_token of the insert that stored the row (0: none); the collector checks its journal against it after a crash' AFTER k8s_view_stale;
{{end}}
