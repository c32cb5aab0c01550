-- The member's round trip on a session no hello named: tsoracle.member_next answers NULL
-- there, having done nothing (bench.py's oracle section: what the call itself costs).
SELECT tsoracle.member_next(:k, 'none');
