-- The privilege matrix (docs/operations/security.md): what each kind of role may call, read
-- and write. Sequences and leases are privileges (the predefined roles tsoracle_seq_user and
-- tsoracle_lease_holder); a key belongs to the role that created it, and its members.
CREATE ROLE regress_plain;
CREATE ROLE regress_seq;
CREATE ROLE regress_seq_other;
CREATE ROLE regress_lease;
GRANT tsoracle_seq_user TO regress_seq, regress_seq_other;
GRANT tsoracle_lease_holder TO regress_lease;

-- As role r: how sql ends (the SQLSTATE, or ok).
CREATE FUNCTION regress.as_role(r text, sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    result text;
BEGIN
    EXECUTE format('SET ROLE %I', r);
    result := split_part(regress.try(sql), ':', 1);
    RESET ROLE;
    RETURN result;
END
$$;

-- A key of regress_seq's.
SELECT regress.as_role('regress_seq', 'SELECT tso_seq(''regress_shared'')') AS created;

-- Left to right: the superuser, a role with no grant, two sequence users, a lease holder.
SELECT call,
       regress.as_role('postgres', call) AS superuser,
       regress.as_role('regress_plain', call) AS plain,
       regress.as_role('regress_seq', call) AS seq_user,
       regress.as_role('regress_seq_other', call) AS seq_other,
       regress.as_role('regress_lease', call) AS lease_holder
FROM (VALUES
    ('SELECT tso_next()'),
    ('SELECT tso_next_batch(2)'),
    ('SELECT tso_next_uuid()'),
    ('SELECT tso_uuid(1), tso_from_uuid(tso_uuid(1))'),
    ('SELECT tso_physical(1), tso_logical(1), tso_to_timestamptz(1), tso_from_timestamptz(now())'),
    ('SELECT tso_resolved()'),
    ('SELECT tso_wait_resolved(1, 0)'),
    ('SELECT * FROM tso_status()'),
    ('SELECT * FROM tso_clock()'),
    ('SELECT * FROM tso_resolved_status()'),
    ('SELECT tso_safe_frontier()'),
    ('SELECT tso_seed(1)'),
    ('SELECT tso_seq(''regress_key_'' || current_user)'),
    ('SELECT tso_seq(''regress_shared'')'),
    ('SELECT tso_seq_peek(''regress_shared'')'),
    ('SELECT * FROM tso_seq_batch(''{regress_shared}'', ''{1}'')'),
    ('SELECT * FROM tso_lease_acquire(''regress_'' || current_user, 1, 10000)'),
    ('SELECT lease_id FROM tso_lease_acquire_bounds(''regress_b_'' || current_user, 1, 10000)'),
    ('SELECT count(*) FROM tsoracle.high_water'),
    ('SELECT count(*) FROM tsoracle.resolved'),
    ('SELECT count(*) FROM tsoracle.seq'),
    ('SELECT count(*) FROM tsoracle.lease'),
    ('UPDATE tsoracle.resolved SET ts = ts'),
    ('INSERT INTO tsoracle.seq (key, next) VALUES (''regress_forged'', 0)'),
    ('UPDATE tsoracle.high_water SET physical_ms = physical_ms'),
    ('SELECT tsoracle.note_restore()'),
    ('SET tsoracle.allow_drop = on; RESET tsoracle.allow_drop'),
    ('DROP EXTENSION tsoracle'),
    ('CREATE TABLE tsoracle.regress_planted (id int)')
) AS v(call);
DROP TABLE tsoracle.regress_planted;
BEGIN;
SET LOCAL tsoracle.allow_drop = on;
DELETE FROM tsoracle.seq WHERE key = 'regress_forged';
COMMIT;

-- A switchover's handover, and the restore's raise of the high-water, are a superuser's
-- (not tried as one here: either would stop the oracle or re-fence it).
SELECT regress.as_role('regress_lease', 'SELECT tso_handover()') AS lease_holder_hands_over;
SELECT regress.as_role('regress_plain', 'SELECT tsoracle.raise_restored_high_water(1, 1)') AS plain_raises;

-- A key belongs to the role that created it (and its members; a superuser is one of all):
-- another sequence user can neither take from it, peek at it nor drop it; its creator can.
SELECT regress.as_role('regress_seq_other', 'SELECT tso_seq_drop(''regress_shared'')') AS other_drops;
SELECT regress.as_role('regress_seq', 'SELECT tso_seq_drop(''regress_shared'')') AS owner_drops;

-- A lease belongs to its holder role: nobody else renews or releases it.
CREATE TABLE regress.lease AS SELECT lease_id FROM tso_lease_acquire('regress_shared', 1, 10000);
GRANT SELECT ON regress.lease TO PUBLIC;
SELECT regress.as_role('regress_lease', 'SELECT tso_lease_renew((SELECT lease_id FROM regress.lease))') AS holder_renews_superusers;
SELECT regress.as_role('regress_lease', 'SELECT tso_lease_release((SELECT lease_id FROM regress.lease))') AS holder_releases_superusers;
SELECT regress.try('SELECT tso_lease_release((SELECT lease_id FROM regress.lease))') AS superuser_releases;
SELECT regress.as_role('regress_plain', 'SELECT tso_lease_renew((SELECT lease_id FROM regress.lease))') AS plain_renews;

-- The messages of three refusals.
SET ROLE regress_plain;
SELECT regress.try('SELECT tso_seq(''x'')');
SELECT regress.try('SET tsoracle.allow_drop = on');
RESET ROLE;
SET ROLE regress_seq_other;
SELECT regress.try('SELECT tso_seq(''regress_key_regress_seq'')');
RESET ROLE;
