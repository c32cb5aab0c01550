-- The SQL surface of the extension: its objects, the result columns of its functions, its
-- tables, the privileges on them, and its settings. A change here is a change of the SQL
-- surface: it comes with an upgrade script and a CHANGELOG entry (sql/README.md).

-- Every object the extension owns (but the tables' row types, which newer majors record as
-- members too).
SELECT pg_describe_object(classid, objid, objsubid) AS object
FROM pg_depend
WHERE refclassid = 'pg_extension'::regclass
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'tsoracle')
  AND deptype = 'e'
  AND classid <> 'pg_type'::regclass
ORDER BY 1;

-- Every function: arguments, result, volatility, strictness, parallel safety, security.
SELECT p.oid::regprocedure AS function,
       CASE WHEN p.proretset AND 't' = ANY (p.proargmodes) THEN 'TABLE (below)'
            ELSE pg_get_function_result(p.oid) END AS result,
       p.provolatile AS volatile,
       p.proisstrict AS strict,
       p.proparallel AS parallel,
       p.prosecdef AS security_definer
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'tsoracle')
ORDER BY p.oid::regprocedure::text;

-- The result columns of the functions that return tables, in order. A released function's
-- columns never change (sql/README.md): a new one is added instead.
SELECT p.oid::regprocedure AS function, c.n AS position, c.name, c.type::regtype AS type
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
CROSS JOIN LATERAL (
    SELECT row_number() OVER () AS n, name, type
    FROM unnest(p.proargnames, p.proallargtypes, p.proargmodes) AS a(name, type, mode)
    WHERE mode = 't'
) c
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'tsoracle')
ORDER BY p.oid::regprocedure::text, c.n;

-- Who may execute what (the default, PUBLIC, is spelled out as a grant to PUBLIC).
SELECT p.oid::regprocedure AS function,
       coalesce(array_to_string(array_agg(
           CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
           ORDER BY 1), ', '), '') AS execute
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
LEFT JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
       ON a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'tsoracle')
GROUP BY p.oid
ORDER BY p.oid::regprocedure::text;

-- The triggers of the tables: when each fires (ALWAYS: in every session, also under
-- session_replication_role = replica, as logical apply runs; REPLICA: only there). The writes
-- made in place rely on keep_what_was_issued firing always (docs/sequences.md).
SELECT t.tgrelid::regclass AS "table", t.tgname AS trigger,
       CASE t.tgenabled WHEN 'O' THEN 'origin' WHEN 'A' THEN 'always' WHEN 'R' THEN 'replica'
            ELSE 'disabled' END AS fires,
       t.tgfoid::regproc AS function
FROM pg_trigger t
WHERE t.tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'tsoracle'::regnamespace)
  AND NOT t.tgisinternal
ORDER BY t.tgrelid::regclass::text, t.tgname;

-- The tables, their columns, and what PUBLIC may do with them.
SELECT c.oid::regclass AS "table", a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
       a.attnotnull AS not_null
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.relnamespace = 'tsoracle'::regnamespace AND c.relkind = 'r'
ORDER BY c.oid::regclass::text, a.attnum;

SELECT c.oid::regclass AS "table",
       coalesce((SELECT string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
                 FROM aclexplode(c.relacl) a WHERE a.grantee = 0), '') AS public
FROM pg_class c
WHERE c.relnamespace = 'tsoracle'::regnamespace AND c.relkind = 'r'
ORDER BY c.oid::regclass::text;

-- The predefined roles.
SELECT rolname, rolcanlogin, rolsuper, rolinherit
FROM pg_roles WHERE rolname LIKE 'tsoracle%' ORDER BY 1;

-- The settings (the tests' own build adds the tsoracle.test_* settings: not part of the
-- surface).
SELECT name, context, vartype, unit, min_val, max_val, boot_val, short_desc
FROM pg_settings
WHERE name LIKE 'tsoracle.%' AND name NOT LIKE 'tsoracle.test\_%'
ORDER BY name;
