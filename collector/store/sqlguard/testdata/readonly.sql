-- Statements a read-only user runs, one per block (blocks end with a line
-- holding only ";;"). Every one must pass sqlguard.Vet and run on the
-- engine without writing anything (TestCorpus).
SELECT 1
;;
select count() from g.t where ip = toIPv6('fd00:10::1') or ip = toIPv6('198.18.0.1')
;;
WITH x AS (SELECT number FROM numbers(3)) SELECT * FROM x
;;
WITH 5 AS k, (SELECT max(n) FROM g.t) AS m SELECT k + m
;;
SELECT * FROM g.t AS a JOIN (SELECT * FROM numbers(2)) AS b ON a.n = b.number FORMAT JSON
;;
SELECT a.n, b.number FROM g.t AS a LEFT ARRAY JOIN [1, 2] AS arr CROSS JOIN numbers(2) AS b
;;
SELECT 'INTO OUTFILE ''x''', 'file(''/etc/passwd'')' AS `file`
;;
SELECT n, count() AS c FROM g.t GROUP BY n WITH TOTALS HAVING c > 0 ORDER BY c DESC, n ASC NULLS LAST LIMIT 5 BY n LIMIT 10 OFFSET 1
;;
SELECT n, sum(n) OVER (PARTITION BY n % 2 ORDER BY n ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM g.t
;;
SELECT n, rank() OVER w FROM g.t WINDOW w AS (ORDER BY n)
;;
SELECT * EXCEPT (n) FROM g.t
;;
SELECT COLUMNS('^i') FROM g.t
;;
SELECT t.* FROM g.t AS t
;;
SELECT * APPLY (toString) FROM g.t
;;
SELECT * REPLACE (n + 1 AS n) FROM g.t
;;
SELECT arrayMap(x -> x * 2, [1, 2, 3]), tuple(1, 'a').2, [1, 2][1], map('a', 1)['a']
;;
SELECT CAST(n AS String), n::UInt8, toTypeName(n), INTERVAL 1 DAY, now() - INTERVAL 5 MINUTE FROM g.t
;;
SELECT CASE WHEN n > 1 THEN 'a' ELSE 'b' END, if(n > 1, 1, 0), multiIf(n = 1, 'x', 'y') FROM g.t
;;
SELECT n FROM g.t WHERE n IN (SELECT number FROM numbers(5)) AND n NOT IN (7, 8) AND n BETWEEN 0 AND 100
;;
SELECT n FROM g.t WHERE toString(ip) LIKE '%' OR isIPAddressInRange(toString(ip), 'fd00:10::/32') OR isIPAddressInRange(toString(ip), '198.18.0.0/15')
;;
SELECT 1 UNION ALL SELECT 2 UNION DISTINCT SELECT 3
;;
SELECT number FROM numbers(10) INTERSECT SELECT number FROM numbers(5) EXCEPT SELECT 1
;;
SELECT number FROM numbers(10) ORDER BY number WITH FILL STEP 2
;;
SELECT * FROM g.t SAMPLE 1 / 10
;;
SELECT * FROM (SELECT number AS n FROM numbers_mt(4)) AS s
;;
SELECT * FROM generateRandom('a UInt8, b IPv6', 1) LIMIT 3
;;
SELECT * FROM values('a UInt8, b String', (1, 'x'), (2, 'y'))
;;
SELECT * FROM generate_series(1, 3)
;;
SELECT * FROM view(SELECT number FROM numbers(2))
;;
SELECT * FROM null('a UInt8')
;;
SELECT number, any(number) FROM numbers(5) GROUP BY GROUPING SETS ((number), ())
;;
SELECT number FROM numbers(5) QUALIFY number > 1
;;
SELECT name, engine FROM system.tables WHERE database = 'g'
;;
SELECT name, type FROM system.columns WHERE database = 'g' AND table = 't'
;;
SELECT * FROM system.one
;;
SELECT name FROM system.databases
;;
SELECT table, sum(rows) FROM system.parts WHERE active GROUP BY table
;;
SELECT name FROM system.functions LIMIT 3
;;
SELECT value FROM system.settings WHERE name = 'max_threads'
;;
SELECT metric, value FROM system.metrics LIMIT 2
;;
SELECT * FROM INFORMATION_SCHEMA.COLUMNS LIMIT 1
;;
SHOW TABLES FROM g
;;
SHOW TABLES FROM g LIKE 't%'
;;
SHOW DATABASES
;;
SHOW SETTINGS LIKE 'max%'
;;
SHOW CREATE TABLE g.t
;;
SHOW COLUMNS FROM g.t
;;
DESCRIBE TABLE g.t
;;
DESC g.t
;;
DESCRIBE (SELECT 1 AS x)
;;
EXISTS TABLE g.t
;;
EXISTS DATABASE g
;;
EXPLAIN SELECT count() FROM g.t
;;
EXPLAIN AST SELECT 1
;;
EXPLAIN SYNTAX SELECT 1
;;
EXPLAIN PLAN header = 1 SELECT n FROM g.t
;;
EXPLAIN PIPELINE SELECT n FROM g.t
;;
EXPLAIN ESTIMATE SELECT n FROM g.t
;;
EXPLAIN QUERY TREE SELECT 1
;;
SELECT '\'; DROP TABLE g.t; SELECT '
;;
SELECT 1;
;;
SELECT $$heredoc; DROP TABLE g.t$$
;;
SELECT 1 -- a comment
;;
SELECT /* INTO OUTFILE 'x' */ 1
