\set id random(1, :rows)
\set v random(1, 1000000)
UPDATE a_tso SET v = :v, version = tso_next() WHERE id = :id;
