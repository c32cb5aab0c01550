SELECT tso_next();
\set done 1
