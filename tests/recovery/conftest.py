"""Recovery tests share the session's SparkSession (``spark``, in ``tests/conftest.py``) and coordinators with the
other Spark tests."""
