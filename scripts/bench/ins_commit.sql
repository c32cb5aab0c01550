INSERT INTO commit_ceiling (v) VALUES (1);
