"""A small PySpark job whose lineage reaches Marquez through Kafka and lineage-relay.

The lineage settings are Spark conf (spark-defaults.conf beside this file): the job code
only turns capture on. Two writes, so Marquez draws a graph: the first writes
``raw_orders``, the second reads it and writes ``daily_revenue``.

    spark-submit --properties-file examples/spark/spark-defaults.conf examples/spark/lineage_example.py
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from producer.spark import enable_lineage

WAREHOUSE = os.environ.get("LINEAGE_EXAMPLE_WAREHOUSE", "/tmp/lineage-example/warehouse")

ORDERS = [
    (1, "2025-01-06", "alice", 120.0),
    (2, "2025-01-06", "bob", 35.5),
    (3, "2025-01-07", "alice", 12.25),
    (4, "2025-01-07", "carol", 80.0),
    (5, "2025-01-08", "bob", 64.0),
]


def main() -> int:
    spark = SparkSession.builder.appName("orders").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    enable_lineage(spark)  # reads spark.openlineage.* from the session's conf
    try:
        raw = f"{WAREHOUSE}/raw_orders"
        daily = f"{WAREHOUSE}/daily_revenue"

        (spark.createDataFrame(ORDERS, "order_id INT, order_date STRING, customer STRING, amount DOUBLE")
         .write.mode("overwrite").parquet(raw))

        (spark.read.parquet(raw)
         .groupBy("order_date")
         .agg(F.sum("amount").alias("revenue"), F.countDistinct("customer").alias("customers"))
         .write.mode("overwrite").parquet(daily))

        for row in spark.read.parquet(daily).orderBy("order_date").collect():
            print(f"{row.order_date}: revenue={row.revenue:.2f} customers={row.customers}")
    finally:
        spark.stop()
    # Events still queued are flushed at interpreter exit (or journaled if Kafka is away).
    return 0


if __name__ == "__main__":
    sys.exit(main())
