"""The driver side: registering a job and its attempts, running the barrier stage, and the supervisor that restarts
it after failures (``restart`` strategies)."""
