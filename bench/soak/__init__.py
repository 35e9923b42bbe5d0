"""bench/soak/: soak, worker kill and restart under load (make soak)."""
