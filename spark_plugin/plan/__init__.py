"""The plan of a pipeline: job vertices and edges, the channels and subtasks they imply, and key groups.

Plain data built in the driver and pickled into every Spark task; nothing here runs a pipeline.
"""
