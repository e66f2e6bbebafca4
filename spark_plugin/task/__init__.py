"""The task side: what runs inside a Spark task. One subtask's parts, its loop, its barrier handling, its checkpoint
actions and channel state, restore, and its boundary to the coordinator; ``life`` takes a subtask from start to end
and ``spark_task`` is the Spark task's body."""
