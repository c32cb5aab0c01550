\if :hello = 0
\set id 1000000 + :client_id
SELECT system_id FROM tsoracle.member_hello(:id, :ver, 0);
SELECT bench_first_next();
SELECT pg_catalog.set_config('tsoracle_member.session', :sess, false);
\set hello 1
\endif
SELECT tsoracle.member_next(:k, :sess);
