"""Running a sweep: the per-point loop, a run's lifecycle, shards and launches, environment, profiling."""
