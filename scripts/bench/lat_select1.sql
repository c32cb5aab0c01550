SELECT 1;
\set done 1
