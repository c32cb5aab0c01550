SELECT nextval('s100');
