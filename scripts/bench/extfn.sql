SELECT show_limit();
