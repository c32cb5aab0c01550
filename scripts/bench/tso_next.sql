SELECT tso_next();
