"""Load generation: schedules and workloads (pure), streaming client, runner, Ray shards."""
