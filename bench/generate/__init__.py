"""bench/generate/: a language model against the servers a user would run instead (PLAN=generate), and its tuning."""
