ATTACH TABLE _ UUID 'ff814caf-c5f3-44a0-b97d-a34d26238481'
(
    `n` UInt64
)
ENGINE = MergeTree
ORDER BY n
SETTINGS index_granularity = 8192
