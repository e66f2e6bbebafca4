"""Overtake PySpark runtime: pipelines as Spark barrier stages with aligned and unaligned checkpoints."""
