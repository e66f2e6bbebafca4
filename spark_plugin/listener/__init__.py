"""The Structured Streaming listener: existing PySpark streaming queries report their micro-batches to the coordinator.

    spark.streams.addListener(OvertakeListener("http://127.0.0.1:8321"))

``query_listener`` is the listener Spark calls and ``install``; ``progress`` reads Spark's events into plain data;
``reporter`` sends it to the coordinator on a background thread.
"""

from spark_plugin.listener.query_listener import CONF_BUFFER, CONF_TOKEN, CONF_URL, OvertakeListener, install

__all__ = ["CONF_BUFFER", "CONF_TOKEN", "CONF_URL", "OvertakeListener", "install"]
