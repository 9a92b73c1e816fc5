from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

pyspark = pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from pylog.spark import jvm

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("pylog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.python.filterPushdown.enabled", "true")
    )
    session = jvm.configure(builder).getOrCreate()  # pylog's JVM reader installed (tests choose the path)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
