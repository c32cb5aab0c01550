SELECT tso_next_batch(1000);
