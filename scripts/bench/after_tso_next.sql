\if :done = 0
SELECT tso_next();
\set done 1
\else
SELECT 1;
\endif
