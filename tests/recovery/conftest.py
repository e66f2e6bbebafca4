"""Recovery tests share the session's SparkSession and coordinators with the other Spark tests."""

from tests.spark_plugin.conftest import spark  # noqa: F401
