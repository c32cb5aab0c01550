\set v random(1, 1000000)
INSERT INTO t_uuid (v) VALUES (:v);
