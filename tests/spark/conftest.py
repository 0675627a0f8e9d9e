"""One local SparkSession for every Spark test of the run (starting one takes seconds): two
worker threads, two shuffle partitions (the test logs are a few records), no UI, and the
driver bound to the loopback address so no test listens on another interface."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

# tests/ is on sys.path (tests/conftest.py), and this directory is named spark/ too: with the
# repository root on sys.path as well, ``import spark`` finds the job's package (a package
# with an __init__.py wins over a plain directory) however pytest was started.
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.append(ROOT)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = (SparkSession.builder
               .master("local[2]")
               .appName("gateway-spark-tests")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
