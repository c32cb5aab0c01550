UPDATE counter SET v = v + 100 WHERE id = 1 RETURNING v;
