"""bench/versus/: the kit against what a user would run instead of it, for the classifiers and embedders."""
