-- 0005: wider merges of the flows table.
--
-- Background merges rewrite every column of every row they touch, and with
-- MergeTree's default merge_selector_base (5) each flow row was rewritten
-- about log5(parts) times: on a 2-core collector, merging flows took a
-- quarter of the CPU at 250k rows/s and capped ingest. With 20 the merge
-- selector waits for about 20 parts of similar size before merging them, so
-- each row is rewritten about half as often (log20 instead of log5). The
-- selector still lowers the base as parts age or multiply, so the number of
-- active parts stays bounded (measured: 27 against 24 after 10M rows).
-- Only the flows table changes: the rollups' parts are a few rows each and
-- their merges cost next to nothing.

ALTER TABLE {{local "flows"}}{{onCluster}} MODIFY SETTING merge_selector_base = 20;
