\set id random(1, :rows)
\set v random(1, 1000000)
UPDATE a_clock SET v = :v, version = clock_timestamp() WHERE id = :id;
