-- tsoracle: privileges and the restore merge, installed last (finalize).

-- Restores (pg_dump/pg_restore, or any superuser's INSERT/COPY) write rows the worker may
-- already hold. Each such row is merged, never lowering anything: the high-water and the
-- counters keep the larger value, an existing lease is kept. When the transaction commits,
-- tsoracle.note_restore() has the worker stop serving and fence again above what was
-- restored. The worker's own writes pass through unchanged.
CREATE FUNCTION tsoracle.merge_restored_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT tsoracle.note_restore() THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'high_water' THEN
        UPDATE tsoracle.high_water AS h
           SET physical_ms = GREATEST(h.physical_ms, NEW.physical_ms),
               epoch = GREATEST(h.epoch, NEW.epoch),
               updated_at = now()
         WHERE h.id = NEW.id;
    ELSIF TG_TABLE_NAME = 'seq' THEN
        UPDATE tsoracle.seq AS s
           SET next = GREATEST(s.next, NEW.next),
               owner = COALESCE(s.owner, NEW.owner),
               updated_at = now()
         WHERE s.key = NEW.key;
    ELSIF TG_TABLE_NAME = 'lease' THEN
        UPDATE tsoracle.lease AS l
           SET ts_upper_bound_ms = GREATEST(l.ts_upper_bound_ms, NEW.ts_upper_bound_ms),
               expires_at_ms = GREATEST(l.expires_at_ms, NEW.expires_at_ms)
         WHERE l.lease_id = NEW.lease_id;
    END IF;
    IF FOUND THEN
        RETURN NULL;  -- merged into the existing row
    END IF;
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION tsoracle.merge_restored_row() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tsoracle.note_restore() FROM PUBLIC;
CREATE TRIGGER merge_restored_row BEFORE INSERT ON tsoracle.high_water
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_row();
CREATE TRIGGER merge_restored_row BEFORE INSERT ON tsoracle.seq
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_row();
CREATE TRIGGER merge_restored_row BEFORE INSERT ON tsoracle.lease
    FOR EACH ROW EXECUTE FUNCTION tsoracle.merge_restored_row();

REVOKE EXECUTE ON FUNCTION tso_seed(bigint) FROM PUBLIC;

-- Predefined roles. Sequences and leases are privileges: grant tsoracle_seq_user to roles
-- that may create and advance counters, tsoracle_lease_holder to lease holders.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tsoracle_lease_holder') THEN
        CREATE ROLE tsoracle_lease_holder NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tsoracle_seq_user') THEN
        CREATE ROLE tsoracle_seq_user NOLOGIN;
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION tso_lease_acquire(text, bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_renew(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_lease_release(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tso_lease_acquire(text, bigint, integer) TO tsoracle_lease_holder;
GRANT EXECUTE ON FUNCTION tso_lease_renew(bigint) TO tsoracle_lease_holder;
GRANT EXECUTE ON FUNCTION tso_lease_release(bigint) TO tsoracle_lease_holder;
REVOKE EXECUTE ON FUNCTION tso_seq(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_seq_batch(text[], integer[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_seq_peek(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tso_seq_drop(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tso_seq(text, integer) TO tsoracle_seq_user;
GRANT EXECUTE ON FUNCTION tso_seq_batch(text[], integer[]) TO tsoracle_seq_user;
GRANT EXECUTE ON FUNCTION tso_seq_peek(text) TO tsoracle_seq_user;
GRANT EXECUTE ON FUNCTION tso_seq_drop(text) TO tsoracle_seq_user;
