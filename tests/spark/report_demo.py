"""The report of a small realistic run, and the screenshot of it in docs/images/.

Two gateways over three hours: gw-east takes sensor readings and orders from local
producers, delivers some to local consumers and exports them through transport ``to-west``
to gw-west, which imports them (``from-east``) and delivers them there. A few messages are
lost at gw-east, a few exports never arrive, some are delivered twice, some late, one is
changed on its way. The records are drawn from a seeded generator, so every run writes the
same logs.

    python tests/spark/report_demo.py [--html FILE] [--png FILE]

writes the report (default: a temporary directory) and, with ``--png``, a screenshot of its
top taken in headless Chromium (Debian's ``chromium``), reduced to a 256-colour palette.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

from dlogrecords import rec, write_log  # noqa: E402

from spark.link import link_by_content  # noqa: E402
from spark.read import read_dlog  # noqa: E402
from spark.report import write_report  # noqa: E402
from spark.routes import routes  # noqa: E402
from spark.schema import DELIVER, EXPORT  # noqa: E402
from spark.verdicts import DELIVERED, verdicts  # noqa: E402

START_MS = 1778749200000.0  # 2026-05-14T09:00:00Z
GRACE_MS = 30_000.0
SUMMARY_VERDICTS = ("delivered", "late", "lost", "pending", "lost_in_transit", "duplicated",
                    "changed", "reordered", "expired", "dead_lettered", "dropped",
                    "discarded")


def demo_records(seed: int = 7) -> dict[str, list[dict[str, Any]]]:
    """The records of each gateway, by gateway name."""
    rnd = random.Random(seed)
    east: list[dict[str, Any]] = []
    west: list[dict[str, Any]] = []
    for i in range(360):
        t = START_MS + i * 30_000.0 + rnd.uniform(0, 20_000)
        trace = f"{i:04x}a7c3e1"
        body = f"{rnd.getrandbits(64):016x}"
        if i % 3 == 0:
            dest, producer = "queue:orders", "amqp:shop-1"
        else:
            dest, producer = "topic:sensors.temp", f"mqtt:sensor-{i % 5}"
        east.append(rec(t, "gw-east", "publish", trace, dest=dest, client=producer,
                        body_hash=body))
        if i % 97 == 13:  # never left gw-east
            continue
        if dest == "topic:sensors.temp":
            late = 45_000.0 if i % 89 == 5 else 0.0
            d = t + rnd.lognormvariate(0.5, 0.8) + late
            east.append(rec(d, "gw-east", "deliver", trace, dest=dest,
                            client="mqtt:dashboard", count=1, body_hash=body))
            if i % 53 == 7:  # a second copy, not flagged as a redelivery
                east.append(rec(d + 4.0, "gw-east", "deliver", trace, dest=dest,
                                client="mqtt:dashboard", count=1, body_hash=body))
        x = t + rnd.lognormvariate(1.0, 0.6)
        east.append(rec(x, "gw-east", "export", trace, dest=dest, client="to-west",
                        body_hash=body, far_dest=dest.split(":", 1)[1]))
        if i % 71 == 11:  # lost between the two gateways
            continue
        m = x + 8.0 + rnd.lognormvariate(2.0, 0.5)  # gw-west's clock is 8 ms ahead
        west.append(rec(m, "gw-west", "import", trace, dest=dest, client="from-east",
                        body_hash=body))
        out = body if i != 150 else f"{rnd.getrandbits(64):016x}"  # changed on the way
        consumer = "stomp:billing" if dest == "queue:orders" else "amqp:archive"
        w = m + rnd.lognormvariate(1.5 if dest == "queue:orders" else 0.8, 0.9)
        west.append(rec(w, "gw-west", "deliver", trace, dest=dest, client=consumer, count=1,
                        body_hash=out))
        if i % 61 == 3:  # redelivered after a consumer's session closed
            west.append(rec(w + 250.0, "gw-west", "redeliver", trace, dest=dest,
                            client=consumer, count=2, body_hash=out))
    return {"gw-east": east, "gw-west": west}


def write_demo_logs(root: Path) -> list[Path]:
    """The demo logs as the gateways write them, one directory per gateway."""
    dirs = []
    for gw, records in demo_records().items():
        d = root / gw
        write_log(d / f"dlog-{gw}-20260514T090000-0001.jsonl",
                  sorted(records, key=lambda r: r["ts"]))
        dirs.append(d)
    return dirs


def summary_of(verdict_rows: DataFrame) -> DataFrame:
    """The run's summary per route per hour, with the columns (and in the order) of the
    output layout; the report reads it, the job makes it: this is the tests' own."""
    exit_ = F.when(F.col("exit").isin(DELIVER, EXPORT), F.col("exit"))
    via = F.when(F.col("exit") == F.lit(EXPORT), F.col("exit_client"))
    hour = F.date_trunc("hour", F.timestamp_seconds(F.col("entry_ts") / 1000.0))

    def rows(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0)).cast("long")

    latency = F.when(F.col("verdict") == F.lit(DELIVERED), F.col("latency_ms"))
    counts = [rows((F.col("verdict") == F.lit(DELIVERED)) & F.col("late")).alias(v)
              if v == "late" else rows(F.col("verdict") == F.lit(v)).alias(v)
              for v in SUMMARY_VERDICTS]
    messages = F.col("messages")
    return (verdict_rows.where(F.col("entry_ts").isNotNull())
            .select("verdict", "trace_id", "gw", "dest", "latency_ms", "late",
                    hour.alias("hour"), exit_.alias("exit_r"), via.alias("via"))
            .withColumnRenamed("exit_r", "exit")
            .groupBy("hour", "gw", "dest", "exit", "via")
            .agg(F.countDistinct("trace_id").cast("long").alias("messages"), *counts,
                 *[F.percentile(latency, q).alias(f"latency_p{int(q * 100)}_ms")
                   for q in (0.5, 0.95, 0.99)],
                 F.max(latency).alias("latency_max_ms"))
            .select("hour", "gw", "dest", "exit", "via", "messages", *SUMMARY_VERDICTS,
                    ((F.col("lost") + F.col("lost_in_transit")) / messages)
                    .alias("loss_rate"),
                    (F.col("duplicated") / messages).alias("duplicate_rate"),
                    "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms"))


def build_report(spark: SparkSession, logdirs: list[Path], html: Path,
                 grace_ms: float = GRACE_MS, worst: int = 20) -> DataFrame:
    """Read the logs, give the verdicts and write the report as the job does; returns the
    verdict rows."""
    records = link_by_content(read_dlog(spark, [str(d) for d in logdirs]), grace_ms, 500.0)
    records = records.cache()
    rows = verdicts(records, grace_ms, 500.0, False, routes(records)).cache()
    write_report(html, rows, summary_of(rows), records, title="Reconciliation report",
                 worst=worst)
    return rows


def screenshot(html: Path, png: Path, width: int = 1100, height: int = 1500) -> None:
    """The top of the report in headless Chromium, reduced to a 256-colour palette."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("Debian's chromium is needed: apt-get install chromium")
    raw = png.with_suffix(".raw.png")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(html.resolve().as_uri(), wait_until="load")
            page.screenshot(path=str(raw))
        finally:
            browser.close()
    with Image.open(raw) as img:
        img.convert("RGB").quantize(colors=256).save(png, optimize=True)
    raw.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args(argv)
    spark = (SparkSession.builder.master("local[2]").appName("report-demo")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        html = args.html or Path(tmp) / "report.html"
        build_report(spark, write_demo_logs(Path(tmp) / "logs"), html)
        if args.png:
            screenshot(html, args.png)
        print(html if args.html else "written (use --html to keep it)")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
