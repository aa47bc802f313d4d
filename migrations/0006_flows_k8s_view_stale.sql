-- 0006: k8s_view_stale marks the rows enriched while the collector's view
-- of the Kubernetes API was stale.
--
-- When the API server cannot be reached (or refuses the collector), the
-- collector keeps enriching with what it last knew, so a pod replaced
-- meanwhile is still named by its predecessor. The collector now knows, per
-- watched kind, whether its watch is open; a row enriched while some kind
-- had been without a watch for 3 s or more is marked, so that SQL users can
-- tell names that may be out of date:
--
--   SELECT countIf(k8s_view_stale) FROM dualflow.flows WHERE flow_end > now() - INTERVAL 1 HOUR;
--
-- Rows written before this migration read false.

ALTER TABLE {{local "flows"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS k8s_view_stale Bool DEFAULT false COMMENT 'enriched while the view of the Kubernetes API was stale: names may be out of date' AFTER verdict_mismatch;
{{if clustered}}
ALTER TABLE {{dist "flows"}}{{onCluster}}
    ADD COLUMN IF NOT EXISTS k8s_view_stale Bool DEFAULT false COMMENT 'enriched while the view of the Kubernetes API was stale: names may be out of date' AFTER verdict_mismatch;
{{end}}
