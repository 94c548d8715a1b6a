"""The sample PySpark pipeline the demo runs and the golden test asserts.

bronze -> silver -> gold on local files, with the operations lineage has to see through:
csv and json reads, a union, renames, a join, a filter, CASE WHEN, an aggregate, a window,
parquet writes, a CTAS into a catalog table, and one action that fails.

    bronze.orders     <- raw/orders.csv  UNION raw/orders_late.csv   (renamed columns)
    bronze.customers  <- raw/customers.json
    silver.orders     <- bronze.orders JOIN bronze.customers, status filter, CASE WHEN size
    gold.daily_revenue   (CTAS, catalog table) <- silver.orders grouped by day, country
    gold/customer_rank   <- silver.orders, rank() over country by spend
    gold/audit           <- a failing write (raise_error), reported as FAIL
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

ORDERS = """id,cust,amount_eur,status,ts
1,10,120.00,ok,2026-11-20 09:10:00
2,11,35.50,ok,2026-11-20 10:00:00
3,10,12.25,cancelled,2026-11-20 11:30:00
4,12,80.00,ok,2026-11-21 08:45:00
5,11,64.00,ok,2026-11-21 17:20:00
"""
ORDERS_LATE = """id,cust,amount_eur,status,ts
6,12,18.00,ok,2026-11-21 23:59:00
7,10,250.00,ok,2026-11-22 07:00:00
"""
CUSTOMERS = """{"customer_id": 10, "name": "Alice", "country": "DE", "email": "alice@example.com"}
{"customer_id": 11, "name": "Bob", "country": "FR", "email": "bob@example.com"}
{"customer_id": 12, "name": "Carol", "country": "DE", "email": "carol@example.com"}
"""

ORDER_SCHEMA = "id INT, cust INT, amount_eur DOUBLE, status STRING, ts TIMESTAMP"
CUSTOMER_SCHEMA = "customer_id INT, name STRING, country STRING, email STRING"


def prepare(workdir: Path) -> dict[str, str]:
    """Fresh raw input files; returns the paths the pipeline uses."""
    shutil.rmtree(workdir, ignore_errors=True)
    raw = workdir / "raw"
    raw.mkdir(parents=True)
    (raw / "orders.csv").write_text(ORDERS)
    (raw / "orders_late.csv").write_text(ORDERS_LATE)
    (raw / "customers.json").write_text(CUSTOMERS)
    lake = workdir / "lake"
    return {
        "orders_csv": str(raw / "orders.csv"), "orders_late_csv": str(raw / "orders_late.csv"),
        "customers_json": str(raw / "customers.json"),
        "bronze_orders": str(lake / "bronze" / "orders"), "bronze_customers": str(lake / "bronze" / "customers"),
        "silver_orders": str(lake / "silver" / "orders"), "customer_rank": str(lake / "gold" / "customer_rank"),
        "audit": str(lake / "gold" / "audit"), "warehouse": str(workdir / "warehouse"),
    }


def run_pipeline(spark: Any, paths: dict[str, str]) -> dict[str, Any]:
    """Run the pipeline on ``spark``; returns a few results (so callers can check capture
    did not change them). The failing action's exception is caught and returned."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # bronze: union two csv drops, rename to the model's column names
    orders = (spark.read.option("header", True).schema(ORDER_SCHEMA).csv(paths["orders_csv"])
              .unionByName(spark.read.option("header", True).schema(ORDER_SCHEMA).csv(paths["orders_late_csv"]))
              .withColumnRenamed("id", "order_id").withColumnRenamed("cust", "customer_id")
              .withColumnRenamed("amount_eur", "amount"))
    orders.write.mode("overwrite").parquet(paths["bronze_orders"])
    spark.read.schema(CUSTOMER_SCHEMA).json(paths["customers_json"]).write.mode("overwrite").parquet(
        paths["bronze_customers"])

    # silver: join, filter, CASE WHEN
    o = spark.read.parquet(paths["bronze_orders"])
    c = spark.read.parquet(paths["bronze_customers"])
    silver = (o.join(c, "customer_id")
              .where(F.col("status") == "ok")
              .select("order_id", "customer_id", F.col("name").alias("customer_name"), "country", "amount",
                      F.to_date("ts").alias("order_date"),
                      F.when(F.col("amount") >= 100, "large").when(F.col("amount") >= 50, "medium")
                      .otherwise("small").alias("size_band")))
    silver.write.mode("overwrite").parquet(paths["silver_orders"])

    # gold: aggregate into a catalog table (CTAS), rank customers with a window
    spark.read.parquet(paths["silver_orders"]).createOrReplaceTempView("silver_orders")
    spark.sql("CREATE DATABASE IF NOT EXISTS gold")
    spark.sql("DROP TABLE IF EXISTS gold.daily_revenue")
    spark.sql("""CREATE TABLE gold.daily_revenue USING parquet AS
                 SELECT order_date, country, SUM(amount) AS total_revenue, COUNT(order_id) AS orders
                 FROM silver_orders GROUP BY order_date, country""")
    spend = (spark.read.parquet(paths["silver_orders"]).groupBy("customer_id", "customer_name", "country")
             .agg(F.sum("amount").alias("spend")))
    w = Window.partitionBy("country").orderBy(F.col("spend").desc())
    spend.withColumn("rank_in_country", F.rank().over(w)).write.mode("overwrite").parquet(paths["customer_rank"])

    # a failing action: the run is reported as FAIL with the error
    failure = None
    try:
        (spark.read.parquet(paths["silver_orders"])
         .select("order_id", F.when(F.col("amount") > 0, F.raise_error(F.lit("audit rule violated")))
                 .otherwise(F.col("amount")).alias("checked"))
         .write.mode("overwrite").parquet(paths["audit"]))
    except Exception as err:  # noqa: BLE001 - expected: this action is meant to fail
        failure = err
    revenue = {(str(r.order_date), r.country): round(r.total_revenue, 2)
               for r in spark.table("gold.daily_revenue").collect()}
    return {"revenue": revenue, "failure": failure}


def demo_producer(*, bootstrap_servers: str, topic: str, workdir: Path, **options: Any) -> Any:
    """The demo's :class:`~producer.kafka.LineageProducer`, its journal in ``workdir``: what
    a throwaway broker never took stays with the demo's files (and goes with the next
    demo's ``prepare``), not in the user's cache, where every later producer would find it."""
    from producer.kafka import LineageProducer

    return LineageProducer(bootstrap_servers=bootstrap_servers, topic=topic,
                           journal_dir=str(Path(workdir) / "journal"), **options)


def run_demo_pipeline(*, bootstrap_servers: str, topic: str, workdir: Path,
                      sent: list[dict[str, Any]] | None = None) -> int:
    """Start a local Spark session with lineage to ``topic``, run the pipeline, stop Spark
    (the application's COMPLETE), flush; returns the number of events emitted (each one is
    also appended to ``sent``, when given)."""
    import orjson
    from pyspark.sql import SparkSession

    from producer.spark import enable_lineage

    paths = prepare(Path(workdir))
    spark = (SparkSession.builder.master("local[2]").appName("lineage_demo")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.warehouse.dir", paths["warehouse"])
             .config("spark.openlineage.namespace", "demo")
             .getOrCreate())
    # FATAL: the pipeline's deliberately failing action would otherwise print Spark's stack trace.
    spark.sparkContext.setLogLevel("FATAL")
    producer = demo_producer(bootstrap_servers=bootstrap_servers, topic=topic, workdir=Path(workdir))
    emitted = 0

    class Counting:
        config = producer.config

        def emit(self, event: dict) -> None:
            nonlocal emitted
            emitted += 1
            if sent is not None:  # a copy: as emitted, whatever happens to the dict later
                sent.append(orjson.loads(orjson.dumps(event)))
            producer.emit(event)

    try:
        enable_lineage(spark, producer=Counting())
        result = run_pipeline(spark, paths)
    finally:
        spark.stop()
        producer.close()
    print(f"ran the sample PySpark pipeline (bronze -> silver -> gold, {len(result['revenue'])} revenue rows, "
          f"one deliberately failing action); captured {emitted} lineage events")
    return emitted
