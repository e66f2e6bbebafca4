"""The wire contract that the coordinator, the SDK and the runtime all stand on: request, response and event models.

Nothing here does I/O or imports another package of the project; ``app``, ``client`` and ``spark_plugin`` import it.
"""
