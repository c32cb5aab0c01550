\set v random(1, 1000000)
INSERT INTO t_rand (v) VALUES (:v);
