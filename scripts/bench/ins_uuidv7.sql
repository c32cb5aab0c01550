\set v random(1, 1000000)
INSERT INTO t_uuidv7 (v) VALUES (:v);
