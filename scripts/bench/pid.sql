SELECT pg_backend_pid();
