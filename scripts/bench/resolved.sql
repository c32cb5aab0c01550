SELECT tso_resolved();
