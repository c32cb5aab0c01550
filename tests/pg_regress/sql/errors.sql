-- Every function's errors on bad input: SQLSTATE, message and HINT (README "Errors" lists
-- the SQLSTATEs). None of these may crash a backend: the next statement of this session runs.
\pset format unaligned
\pset tuples_only on

-- Timestamps.
SELECT regress.try('SELECT tso_next_batch(0)');
SELECT regress.try('SELECT tso_next_batch(-1)');
SELECT regress.try('SELECT tso_next_batch(262145)');
SELECT regress.try('SELECT tso_next_batch(262144)');
SELECT regress.try('SELECT tso_physical(-1)');
SELECT regress.try('SELECT tso_logical(-1)');
SELECT regress.try('SELECT tso_to_timestamptz(-1)');
SELECT regress.try('SELECT tso_to_timestamptz(9223372036854775807)');
SELECT regress.try($$SELECT tso_from_timestamptz('infinity')$$);
SELECT regress.try($$SELECT tso_from_timestamptz('-infinity')$$);
SELECT regress.try($$SELECT tso_from_timestamptz('1969-12-31 23:59:59.999+00')$$);
SELECT regress.try($$SELECT tso_from_timestamptz('4000-01-01 00:00:00+00')$$);
SELECT tso_physical(tso_from_timestamptz('2026-01-02 03:04:05.678+00')) AS physical,
       tso_logical(tso_from_timestamptz('2026-01-02 03:04:05.678+00')) AS logical;
SELECT tso_to_timestamptz(((1767323045678::bigint) << 18) | 5) AT TIME ZONE 'UTC' AS utc;
SELECT regress.try('SELECT tso_seed(-1)');
SELECT regress.try('SELECT tso_seed(0)');
-- STRICT: NULL in, NULL out.
SELECT tso_next_batch(NULL) IS NULL AS strict_batch, tso_physical(NULL) IS NULL AS strict_physical;

-- UUIDs.
SELECT regress.try('SELECT tso_uuid(-1)');
SELECT regress.try($$SELECT tso_from_uuid('00000000-0000-0000-0000-000000000000')$$);
SELECT regress.try($$SELECT tso_from_uuid('0190a1b2-c3d4-4e5f-8a6b-7c8d9e0f1a2b')$$);
SELECT regress.try($$SELECT tso_from_uuid('0190a1b2-c3d4-7e5f-0a6b-7c8d9e0f1a2b')$$);
SELECT tso_from_uuid(tso_uuid(((1767323045678::bigint) << 18) | 5)) = (((1767323045678::bigint) << 18) | 5) AS round_trip;

-- Sequences.
SELECT regress.try($$SELECT tso_seq(NULL)$$);
SELECT regress.try($$SELECT tso_seq('')$$);
SELECT regress.try($$SELECT tso_seq(repeat('k', 1000))$$);
SELECT regress.try($$SELECT tso_seq('k', NULL)$$);
SELECT regress.try($$SELECT tso_seq('k', 0)$$);
SELECT regress.try($$SELECT tso_seq('k', -5)$$);
SELECT regress.try($$SELECT tso_seq('k', 65537)$$);
SELECT tso_seq('k', 10) AS first, tso_seq('k') AS next, tso_seq_peek('k') AS peek;
SELECT regress.try($$SELECT * FROM tso_seq_batch(NULL, '{1}')$$);
SELECT regress.try($$SELECT * FROM tso_seq_batch('{}', '{}')$$);
SELECT regress.try($$SELECT * FROM tso_seq_batch('{a,b}', '{1}')$$);
SELECT regress.try($$SELECT * FROM tso_seq_batch('{a,a}', '{1,1}')$$);
SELECT regress.try($$SELECT * FROM tso_seq_batch('{a,NULL}', '{1,1}')$$);
SELECT regress.try($$SELECT * FROM tso_seq_batch('{a,b}', '{1,0}')$$);
SELECT * FROM tso_seq_batch('{k,j}', '{5,2}');
SELECT regress.try($$SELECT tso_seq_peek(NULL)$$);
SELECT tso_seq_peek('never-used') IS NULL AS peek_unknown;
SELECT regress.try($$SELECT tso_seq_drop(NULL)$$);
SELECT tso_seq_drop('never-used') AS drop_unknown, tso_seq_drop('j') AS drop_j;

-- Leases.
SELECT regress.try($$SELECT * FROM tso_lease_acquire(NULL, 1, 10000)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire('', 1, 10000)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire('h', NULL, 10000)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire('h', -1, 10000)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire('h', 1, NULL)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire('h', 1, 10)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire('h', 1, 2147483647)$$);
SELECT regress.try('SELECT * FROM tso_lease_renew(-1)');
SELECT regress.try('SELECT * FROM tso_lease_renew(123456789)');
SELECT regress.try('SELECT tso_lease_release(123456789)');
SELECT regress.try($$SELECT * FROM tso_lease_acquire('h', 2, 10000)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire('h', 1, 10000)$$);
-- The functions that tell the lowest stamp check their arguments alike.
SELECT regress.try($$SELECT * FROM tso_lease_acquire_bounds(NULL, 1, 10000)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire_bounds('h', 1, 10)$$);
SELECT regress.try($$SELECT * FROM tso_lease_acquire_bounds('h', 1, 10000)$$);
SELECT regress.try('SELECT * FROM tso_lease_renew_bounds(123456789)');
SELECT lower > 0 AND lower <= upper AS lower_within_upper
FROM (SELECT ts_lower_bound AS lower, ts_upper_bound AS upper
      FROM tso_lease_acquire_bounds('hb', 1, 10000)) g;

-- The resolved timestamp.
SELECT regress.try('SELECT tso_wait_resolved(-1, 10)');
SELECT regress.try('SELECT tso_wait_resolved(1, -10)');
SELECT tso_wait_resolved(1, 0) >= 1 AS passed_long_ago;
BEGIN;
SELECT tso_next() > 0 AS took_one;
SELECT regress.try('SELECT tso_wait_resolved(tso_next(), 10)');
ROLLBACK;
BEGIN;
SELECT tso_next() > 0 AS took_one;
PREPARE TRANSACTION 'holds values';
\set VERBOSITY sqlstate
BEGIN;
SELECT tso_next_batch(3) > 0 AS took_three;
PREPARE TRANSACTION 'holds values';
\set VERBOSITY default
BEGIN;
SELECT tso_seq('k') > 0 AS took_a_block_only;
PREPARE TRANSACTION 'takes a block only';
COMMIT PREPARED 'takes a block only';

-- The published resolved timestamp is the worker's, even against a superuser.
SELECT regress.try('UPDATE tsoracle.resolved SET ts = 0');
-- So is lowering or removing what the other tables hold (raising is a restore's business:
-- the worker fences again above it).
SELECT regress.try('UPDATE tsoracle.high_water SET physical_ms = 0');
SELECT regress.try('UPDATE tsoracle.high_water SET epoch = epoch - 1');
SELECT regress.try('DELETE FROM tsoracle.high_water');
SELECT regress.try('TRUNCATE tsoracle.high_water');
SELECT regress.try($$UPDATE tsoracle.seq SET next = 0 WHERE key = 'k'$$);
SELECT regress.try($$UPDATE tsoracle.seq SET key = 'k2' WHERE key = 'k'$$);
SELECT regress.try($$DELETE FROM tsoracle.seq WHERE key = 'k'$$);
SELECT regress.try('TRUNCATE tsoracle.seq');
SELECT regress.try($$UPDATE tsoracle.lease SET expires_at_ms = 0 WHERE holder = 'h'$$);
SELECT regress.try($$DELETE FROM tsoracle.lease WHERE holder = 'h'$$);
SELECT regress.try('TRUNCATE tsoracle.lease');
SELECT regress.try($$UPDATE tsoracle.seq SET next = next WHERE key = 'k'$$);
SELECT regress.try($$UPDATE tsoracle.lease SET renewed_at = renewed_at WHERE holder = 'h'$$);
-- A superuser who accepts the loss, in a transaction rolled back here.
BEGIN;
SET LOCAL tsoracle.allow_drop = on;
SELECT regress.try($$DELETE FROM tsoracle.seq WHERE key = 'k'$$);
ROLLBACK;
SELECT tso_seq_peek('k') AS k_still_there;
SELECT regress.try('TRUNCATE tsoracle.resolved');
-- A member's mark, as a restore writes it (in transactions rolled back here: committed, it
-- would make this cluster one that has been a member): merged into the same oracle's mark
-- (the higher epoch), refused for another oracle's, and updated by the worker only.
BEGIN;
INSERT INTO tsoracle.member_oracle (system_id, epoch) VALUES (4242, 5);
INSERT INTO tsoracle.member_oracle (system_id, epoch) VALUES (4242, 7);
INSERT INTO tsoracle.member_oracle (system_id, epoch) VALUES (4242, 6);
SELECT system_id, epoch FROM tsoracle.member_oracle;
SELECT regress.try('INSERT INTO tsoracle.member_oracle (system_id, epoch) VALUES (4343, 9)');
SELECT regress.try('UPDATE tsoracle.member_oracle SET epoch = 1');
ROLLBACK;
SELECT count(*) AS no_mark FROM tsoracle.member_oracle;
-- As a subscriber's apply runs (session_replication_role = replica): a delete is skipped, the
-- row kept; a truncate is refused, as in any session; a lowering update is raised back.
BEGIN;
SET LOCAL session_replication_role = replica;
SELECT regress.try($$DELETE FROM tsoracle.seq WHERE key = 'k'$$);
SELECT regress.try('TRUNCATE tsoracle.seq');
ROLLBACK;
BEGIN;
SET LOCAL session_replication_role = replica;
DELETE FROM tsoracle.seq WHERE key = 'k';
DELETE FROM tsoracle.lease WHERE holder = 'h';
DELETE FROM tsoracle.high_water;
UPDATE tsoracle.seq SET next = 0 WHERE key = 'k';
SELECT (SELECT count(*) FROM tsoracle.seq WHERE key = 'k') AS seq_kept,
       (SELECT next > 0 FROM tsoracle.seq WHERE key = 'k') AS seq_not_lowered,
       (SELECT count(*) FROM tsoracle.lease WHERE holder = 'h') AS lease_kept,
       (SELECT count(*) FROM tsoracle.high_water) AS high_water_kept;
ROLLBACK;

-- Parallel mode: a function that issues a value refuses inside a parallel operation (as
-- nextval() does), also called from a function that claims to be PARALLEL SAFE (PL/pgSQL, so
-- that the call is not inlined into the outer query, which would see it is unsafe).
BEGIN;
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
                       THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'on', true) AS parallel;
CREATE FUNCTION regress.par(sql text) RETURNS text LANGUAGE plpgsql PARALLEL SAFE AS $f$
DECLARE v text;
BEGIN
    EXECUTE sql INTO v;
    RETURN v;
END
$f$;
SELECT regress.try('SELECT regress.par(''SELECT tso_next()'')');
SELECT regress.try('SELECT regress.par(''SELECT tso_next_batch(2)'')');
SELECT regress.try('SELECT regress.par(''SELECT tso_next_uuid()'')');
SELECT regress.try($$SELECT regress.par('SELECT tso_seq(''k'')')$$);
SELECT regress.try($$SELECT regress.par('SELECT start FROM tso_seq_batch(ARRAY[''k''], ARRAY[1])')$$);
SELECT regress.try($$SELECT regress.par('SELECT lease_id FROM tso_lease_acquire_bounds(''hp'', 1, 10000)')$$);
SELECT regress.try('SELECT regress.par(''SELECT tso_seed(1)'')');
ROLLBACK;

-- Drops.
SELECT regress.try('DROP EXTENSION tsoracle');
SELECT regress.try('DROP EXTENSION tsoracle CASCADE');
SELECT regress.try('DROP SCHEMA public CASCADE');
SELECT regress.try('DROP TABLE tsoracle.high_water');
SELECT regress.try('SET tsoracle.allow_drop = on; SET tsoracle.allow_drop = off');

-- Settings.
SELECT regress.try('SET tsoracle.max_lead_ms = 5');
SELECT regress.try('SET tsoracle.database = ''other''');

-- Still the same backend, and the oracle still serves.
SELECT tso_next() > 0 AS serving;
