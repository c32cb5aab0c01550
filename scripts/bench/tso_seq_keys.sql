\set k random(1, 8)
SELECT tso_seq('k' || :k, 100);
