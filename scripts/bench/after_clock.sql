\if :done = 0
SELECT clock_timestamp();
\set done 1
\else
SELECT 1;
\endif
