SELECT clock_timestamp();
