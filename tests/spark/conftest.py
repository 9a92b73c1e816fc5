from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from spark_helpers import HAS_JAVA, HAS_JAVAC

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

pyspark = pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from pylog.spark import jvm

    if not HAS_JAVA:
        pytest.skip("Spark needs a Java runtime: no java on PATH or in JAVA_HOME")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("pylog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.python.filterPushdown.enabled", "true")
    )
    if HAS_JAVAC:  # pylog's JVM reader installed (tests choose the path); tests of it skip without javac
        builder = jvm.configure(builder)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
