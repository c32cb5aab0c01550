-- The member's round trip on sessions no hello named: tsoracle.member_next answers NULL
-- there, having done nothing (bench.py's oracle section: what the statement itself costs).
SELECT tsoracle.member_next(:k, :sess);
