"""Running pipelines without Spark, for tests and debugging: every subtask as a thread of one process, and failure
injection (Spark tasks announce their Python worker's pid so a test can kill it)."""
