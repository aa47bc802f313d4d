-- 0011: traceflow results get a retention of their own.
--
-- Until now the traceflows table followed the flows' retention
-- (--clickhouse.ttl-days, 30 days by default): every trace any operator
-- started was kept as long as the flows. A trace is a diagnosis of the
-- moment, so it is now kept Options.TraceflowDays: 7 days
-- (DefaultTraceflowTTLDays), or the flows' retention when shorter, and
-- forever only when the flows are kept forever (ttl-days 0, no TTL at
-- all). The runner keeps the TTL in step when the options change
-- (reconcileTTL). On a cluster the TTL is per shard, on the local table.

{{with traceflowTTL "started"}}
ALTER TABLE {{local "traceflows"}}{{onCluster}} MODIFY {{.}};
{{end}}
