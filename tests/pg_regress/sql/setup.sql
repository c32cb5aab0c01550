-- What the other files use: regress.try(sql) runs one statement and says how it ended — ok,
-- or the SQLSTATE, the message, the DETAIL and the HINT of its error — so that the expected
-- output pins them all (psql's default verbosity prints no SQLSTATE; its verbose one prints
-- source locations, which move with every change of the code). The values of the moment in
-- a message (a timestamp a transaction holds, the high-water to seed) read <ts> and <ms>.
CREATE SCHEMA regress;
GRANT USAGE ON SCHEMA regress TO PUBLIC;
CREATE FUNCTION regress.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    state text;
    message text;
    detail text;
    hint text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
        detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN regexp_replace(regexp_replace(
        state || ': ' || message
            || coalesce(nullif(E'\n  DETAIL: ' || detail, E'\n  DETAIL: '), '')
            || coalesce(nullif(E'\n  HINT: ' || hint, E'\n  HINT: '), ''),
        'timestamp \d+', 'timestamp <ts>', 'g'), 'tso_seed\(\d+\)', 'tso_seed(<ms>)', 'g');
END
$$;
-- The oracle serves (scripts/test-regress.sh waited for it).
SELECT tso_next() > 0 AS serving;
