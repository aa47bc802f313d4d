ATTACH TABLE _ UUID '90dfa38d-4421-4ca4-9443-5f219273ca2a'
(
    `ip` IPv6,
    `n` UInt64
)
ENGINE = MergeTree
ORDER BY n
SETTINGS index_granularity = 8192
