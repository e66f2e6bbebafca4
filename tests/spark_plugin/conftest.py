"""The Spark tests' shared SparkSession is the ``spark`` fixture of ``tests/conftest.py`` (one for the whole pytest
session, whatever directory a test is in)."""
