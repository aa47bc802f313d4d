-- Statements sqlguard.Vet must refuse for a read-only user, one per block
-- (blocks end with a line holding only ";;"). OUTFILE stands for a path in
-- the test's canary directory, RELATIVE for a relative path, SECRET for a
-- file the engine must not read. TestCorpus runs them.
SELECT 1 INTO OUTFILE 'OUTFILE' FORMAT RawBLOB
;;
select 1 /* hidden */ into   outfile 'OUTFILE' APPEND
;;
SELECT 1 INTO OUTFILE 'OUTFILE' TRUNCATE FORMAT CSV
;;
SELECT 1 INTO OUTFILE 'OUTFILE' AND STDOUT
;;
SELECT 1 INTO OUTFILE 'OUTFILE' COMPRESSION 'gzip' LEVEL 3
;;
SELECT 1 INTO OUTFILE 'RELATIVE'
;;
SELECT 1 UNION ALL SELECT 2 INTO OUTFILE 'OUTFILE'
;;
DESCRIBE (SELECT 1 AS `* * * * * root touch /tmp/x`) INTO OUTFILE 'OUTFILE' FORMAT TSVRaw
;;
DESC g.t INTO OUTFILE 'OUTFILE'
;;
SHOW TABLES INTO OUTFILE 'OUTFILE'
;;
SHOW TABLES FROM g LIKE 't' INTO OUTFILE 'OUTFILE' TRUNCATE
;;
SHOW CREATE TABLE g.t INTO OUTFILE 'OUTFILE'
;;
EXISTS TABLE g.t INTO OUTFILE 'OUTFILE'
;;
EXISTS DATABASE g INTO OUTFILE 'OUTFILE' APPEND
;;
EXPLAIN SELECT 1 INTO OUTFILE 'OUTFILE'
;;
EXPLAIN AST SELECT 1 INTO OUTFILE 'OUTFILE'
;;
EXPLAIN SYNTAX SELECT 1 INTO OUTFILE 'OUTFILE'
;;
EXPLAIN (SELECT 1) INTO OUTFILE 'OUTFILE'
;;
SELECT * FROM file('SECRET', 'LineAsString')
;;
SELECT * FROM FILE('SECRET', 'LineAsString')
;;
SELECT file('SECRET')
;;
SELECT * FROM (SELECT * FROM url('http://127.0.0.1:1/', 'CSV', 'a String'))
;;
SELECT * FROM url('http://[fd00:10::1]:1/', 'CSV', 'a String')
;;
SELECT * FROM numbers(1) WHERE number IN (SELECT number FROM remote('127.0.0.1', numbers(1)))
;;
SELECT * FROM executable('id', 'TSV', 'a String')
;;
SELECT * FROM s3('http://198.18.0.1:1/bucket/key', 'CSV', 'a String')
;;
SELECT * FROM merge('g', '^t$')
;;
SELECT * FROM merge(REGEXP('^sys'), '^processes$')
;;
SELECT * FROM input('a UInt8')
;;
SELECT * FROM clusterAllReplicas('default', system.one)
;;
SELECT * FROM dictionary('d')
;;
DESCRIBE file('SECRET', 'LineAsString')
;;
SELECT query FROM system.processes
;;
SELECT * FROM system.query_log
;;
SELECT * FROM (SELECT query FROM system.processes)
;;
SELECT 1 WHERE 1 IN system.processes
;;
SELECT last_error_message FROM system.errors
;;
SELECT * FROM view(SELECT query FROM system.processes)
;;
SHOW PROCESSLIST
;;
SHOW GRANTS
;;
SHOW USERS
;;
SELECT 1 SETTINGS max_execution_time = 0
;;
SELECT * FROM (SELECT 1 SETTINGS max_memory_usage = 0)
;;
SELECT 1 SETTINGS output_format_schema = 'OUTFILE'
;;
KILL QUERY WHERE 1
;;
KILL QUERY WHERE query_id = 'x' SYNC
;;
EXPLAIN AST KILL QUERY WHERE 1
;;
EXPLAIN PIPELINE INSERT INTO g.t SELECT * FROM g.t
;;
SYSTEM STOP MERGES
;;
SYSTEM FLUSH LOGS
;;
INSERT INTO g.t VALUES ('::1', 1)
;;
INSERT INTO FUNCTION file('OUTFILE', 'RawBLOB') SELECT 'x'
;;
INSERT INTO g.t SELECT * FROM g.t
;;
DROP TABLE g.t
;;
TRUNCATE TABLE g.t
;;
ALTER TABLE g.t DELETE WHERE 1
;;
DELETE FROM g.t WHERE 1
;;
UPDATE g.t SET n = 0 WHERE 1
;;
CREATE TABLE g.u (a UInt8) ENGINE = Memory
;;
CREATE TABLE g.f (a String) ENGINE = File(RawBLOB, 'OUTFILE')
;;
RENAME TABLE g.t TO g.t2
;;
SET readonly = 0
;;
USE system
;;
OPTIMIZE TABLE g.t
;;
BACKUP TABLE g.t TO File('OUTFILE')
;;
CHECK TABLE g.t
;;
GRANT ALL ON *.* TO default
;;
SELECT 1; DROP TABLE g.t
;;
SELECT 1; SELECT 1 INTO OUTFILE 'OUTFILE'
;;
SELECT 1 /* ; */; KILL QUERY WHERE 1
;;
SELECT ';'; DROP TABLE g.t
;;
SELECT 1 -- comment
; DROP TABLE g.t
;;
SELECT FROM WHERE
