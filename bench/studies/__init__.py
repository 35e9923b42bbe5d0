"""bench/studies/: one-off measurements that decide a setting (preprocessing, length buckets, container start)."""
