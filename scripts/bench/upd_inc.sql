\set id random(1, :rows)
\set v random(1, 1000000)
UPDATE a_inc SET v = :v, version = version + 1 WHERE id = :id;
