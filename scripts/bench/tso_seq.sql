SELECT tso_seq('k', 100);
