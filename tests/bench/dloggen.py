"""Synthetic delivery logs for the reconciliation benchmark: three gateways' files, in the
format the gateway writes (docs/delivery-log.md, schema version 2), with known verdicts.

    .venv/bin/python tests/bench/dloggen.py --records 1000000 --out /tmp/dlogs --seed 1

Gateways ``gw-a``, ``gw-b`` and ``gw-c`` each write their own directory ``OUT/<gw>/`` of
``dlog-<gw>-<UTC yyyymmddTHHMMSS>-<seq>.jsonl`` files. A line is what ``gateway/dlog_format.py``
writes (``_format_fast``): every key of the document in its order, no spaces, ``ts`` as
epoch milliseconds with three decimals, ``trace_id`` ``<gateway id>:<n>``, ``msg_id``
``ID:<gateway>.<hex>:<n>``, import and export records with the transport's client id
(``$transport:<name>``), its name as the reason, and the far side's destination (an MQTT
topic; an MQTT hop has no far id).

Messages are sent at ``--rate`` per second in all, round robin over the gateways and, on each,
over 2,000 devices (so one device sends every few seconds: nothing is reordered), each device
publishing to its plant's topic. A message is one of:

* 40%: published and delivered to one consumer (2 records);
* 20%: published and delivered to two consumers (3 records);
* 40%: published, exported through the transport to another gateway, imported there and
  delivered to a consumer there (4 records); 5% of the exports ran a mapping rule (``rules``
  set, the export's body hash differs).

Then 0.1% of the messages are *lost* (every exit of their last gateway is left out: only the
publish remains, or the publish, export and import) and 0.1% are *duplicated* (their last
delivery is written again, as a ``redeliver`` with count 2 or as a second ``deliver``). A lost
message is always planted more than twice the default grace period (30 s) before the end of
the logs, so it is ``lost``, never ``pending``. Latencies are a few milliseconds, each
gateway's clock is off by a few milliseconds (``SKEW_MS``), and every message has a body hash
(half of them a properties hash too). The verdicts a reconciliation must find are written to
``OUT/manifest.json`` (``expected``: ``delivered``, ``lost``, ``duplicated``, and zero
``pending``, ``lost_in_transit``, ``changed``, ``reordered``).

Fast and deterministic: the messages are cut into chunks of ``CHUNK`` messages, each made
from its own ``random.Random(f"{seed}:{chunk}")`` by plain string joins and written as one
file per gateway (its ``<seq>`` is the chunk's number), in ``--jobs`` processes. The same
``--records`` and ``--seed`` give the same files whatever ``--jobs``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

GATEWAYS = ("gw-a", "gw-b", "gw-c")
SKEW_MS = (0.0, 3.5, -2.25)  # each gateway's clock minus the true time
MSG_PREFIX = ("ID:gw-a.1f3a2c4e91b07:", "ID:gw-b.2a07d1c5f3e22:", "ID:gw-c.3c11e8b20d9a4:")
DEVICES = 2000  # per gateway; a device sends every 3 * DEVICES messages
PLANTS = 50
KINDS = ("temp", "humidity", "pressure", "vibration")
CONSUMERS = 40  # per gateway, per protocol
CHUNK = 200_000  # messages per chunk: one file of about 200,000 records per gateway
START_MS = 1_795_324_332_000  # 2026-11-22T...: the first message's time, epoch ms
RECORDS_PER_MESSAGE = 3.0  # the mix's mean (0.4 * 2 + 0.2 * 3 + 0.4 * 4)
LOST_RATE = 0.001
DUPLICATE_RATE = 0.001
RULE_RATE = 0.05
GRACE_MS = 30_000.0  # spark.job's default grace period; lost messages are planted before
#                      the end minus twice this


def _mix(x: int, seed: int) -> int:
    """64 well-mixed bits of ``x`` (splitmix64's finaliser): a stand-in for a body's BLAKE2b
    digest (the reconciliation only compares hashes), at a fraction of its cost."""
    x = (x * 0x9E3779B97F4A7C15 + seed) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _chunk(args: tuple[int, int, int, float, str]) -> dict[str, int]:
    """Writes chunk ``k`` (messages ``k * CHUNK`` .. of ``total``) and returns its counts."""
    seed, k, total, rate, out_dir = args
    rng = random.Random(f"{seed}:{k}")
    rnd, uni = rng.random, rng.uniform
    lines: list[list[str]] = [[], [], []]
    start = [',"gw":"' + g + '","event":' for g in GATEWAYS]
    tail = ',"rules":null,"far_id":null,"far_dest":null,"lost":null}\n'
    step_ms = 1000.0 / rate
    lost_before = START_MS + total * step_ms - 2 * GRACE_MS
    counts = {"messages": 0, "records": 0, "delivered": 0, "lost": 0, "duplicated": 0}

    def ts(g: int, t: float) -> str:
        us = round((t + SKEW_MS[g]) * 1000.0)
        return '{"v":2,"ts":' + str(us // 1000) + "." + f"{us % 1000:03d}"

    first = k * CHUNK
    for i in range(first, min(first + CHUNK, total)):
        g = i % 3
        n = i // 3 + 1
        dev = n % DEVICES
        plant = dev % PLANTS
        kind = KINDS[(dev // PLANTS) % len(KINDS)]
        dest = f"topic:sensors.plant{plant}.{kind}"
        t0 = START_MS + i * step_ms + rnd() * step_ms * 0.5
        trace = f'"trace_id":"{GATEWAYS[g]}:{n}","msg_id":"{MSG_PREFIX[g]}{n}",'
        body = f"{_mix(n * 3 + g, seed):016x}"
        props = f'"{_mix(n * 3 + g, ~seed):016x}"' if n & 1 else "null"
        mode = '"PERSISTENT"' if n % 10 else '"NON_PERSISTENT"'
        size = 100 + (n * 37) % 200
        head_tail = f',"mode":{mode},"size":{size},"reason":'
        hashes = f',"body_hash":"{body}","props_hash":{props}'
        place = f'"dest":"{dest}","client":'
        r = rnd()
        fate = rnd()
        lose = fate < LOST_RATE and t0 <= lost_before
        dup = LOST_RATE <= fate < LOST_RATE + DUPLICATE_RATE
        out = lines[g]
        out.append(ts(g, t0) + start[g] + '"publish",' + trace + place
                   + f'"mqtt:dev-{dev:04d}","count":0' + head_tail + "null" + hashes + tail)
        recs = 1
        if r < 0.6:  # delivered on the gateway it was published to (one or two consumers)
            if lose:
                counts["lost"] += 1
            else:
                subs = 1 if r < 0.4 else 2
                t = t0
                c = (n * 7) % CONSUMERS
                for s in range(subs):
                    t += uni(0.2, 4.0)
                    client = f'"amqp:c-{c}"' if s == 0 else f'"stomp:s-{(c + 11) % CONSUMERS}"'
                    out.append(ts(g, t) + start[g] + '"deliver",' + trace + place + client
                               + ',"count":1' + head_tail + "null" + hashes + tail)
                    counts["delivered"] += 1
                    recs += 1
                if dup:
                    redeliver = n & 2
                    t += uni(1.0, 50.0)
                    out.append(ts(g, t) + start[g] + ('"redeliver",' if redeliver else
                                                      '"deliver",')
                               + trace + place + client
                               + (',"count":2' if redeliver else ',"count":1')
                               + head_tail + "null" + hashes + tail)
                    counts["duplicated"] += 1
                    recs += 1
        else:  # exported to another gateway, imported and delivered there
            h = (g + 1 + (n & 1)) % 3
            topic = f"sensors/plant{plant}/{kind}"
            rule = rnd() < RULE_RATE
            ex_body = f"{int(body, 16) ^ 0x5BD1E995:016x}" if rule else body
            ex_hashes = f',"body_hash":"{ex_body}","props_hash":{props}'
            t1 = t0 + uni(0.3, 3.0)
            out.append(ts(g, t1) + start[g] + '"export",' + trace + place
                       + f'"$transport:to-{GATEWAYS[h]}","count":0' + head_tail
                       + f'"transport:to-{GATEWAYS[h]}"' + ex_hashes
                       + (',"rules":"sensor-json"' if rule else ',"rules":null')
                       + f',"far_id":null,"far_dest":"{topic}","lost":null}}\n')
            counts["delivered"] += 1
            far = lines[h]
            t2 = t1 + uni(1.0, 8.0)
            far_trace = f'"trace_id":"{GATEWAYS[g]}:{n}","msg_id":"{MSG_PREFIX[h]}{i + 1}",'
            far_place = f'"dest":"{dest}","client":'
            far.append(ts(h, t2) + start[h] + '"import",' + far_trace + far_place
                       + f'"$transport:from-{GATEWAYS[g]}","count":0' + head_tail
                       + f'"transport:from-{GATEWAYS[g]}"' + ex_hashes
                       + f',"rules":null,"far_id":null,"far_dest":"{topic}","lost":null}}\n')
            recs += 2
            if lose:
                counts["lost"] += 1
            else:
                t3 = t2 + uni(0.2, 4.0)
                client = f'"amqp:c-{(n * 3) % CONSUMERS}"'
                far.append(ts(h, t3) + start[h] + '"deliver",' + far_trace + far_place + client
                           + ',"count":1' + head_tail + "null" + ex_hashes + tail)
                counts["delivered"] += 1
                recs += 1
                if dup:
                    redeliver = n & 2
                    t3 += uni(1.0, 50.0)
                    far.append(ts(h, t3) + start[h] + ('"redeliver",' if redeliver else
                                                       '"deliver",')
                               + far_trace + far_place + client
                               + (',"count":2' if redeliver else ',"count":1')
                               + head_tail + "null" + ex_hashes + tail)
                    counts["duplicated"] += 1
                    recs += 1
        counts["messages"] += 1
        counts["records"] += recs
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(START_MS / 1000.0))
    for g, gw in enumerate(GATEWAYS):
        path = Path(out_dir) / gw / f"dlog-{gw}-{stamp}-{k + 1:04d}.jsonl"
        path.write_text("".join(lines[g]), encoding="ascii")
    return counts


def generate(records: int, out: Path, seed: int = 1, rate: float = 1000.0,
             jobs: int | None = None) -> dict[str, Any]:
    """Writes about ``records`` records under ``out`` (emptied first) and returns the
    manifest (also written to ``out/manifest.json``)."""
    total = max(1, round(records / RECORDS_PER_MESSAGE))
    if out.exists():
        shutil.rmtree(out)
    for gw in GATEWAYS:
        (out / gw).mkdir(parents=True)
    chunks = [(seed, k, total, rate, str(out)) for k in range((total + CHUNK - 1) // CHUNK)]
    t = time.perf_counter()
    sums = {"messages": 0, "records": 0, "delivered": 0, "lost": 0, "duplicated": 0}
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for counts in pool.map(_chunk, chunks):
            for key, value in counts.items():
                sums[key] += value
    manifest = {
        "requested_records": records, "seed": seed, "rate": rate,
        "records": sums["records"], "messages": sums["messages"],
        "bytes": sum(p.stat().st_size for p in out.rglob("dlog-*.jsonl")),
        "seconds": round(time.perf_counter() - t, 2),
        "grace_ms_max": GRACE_MS,
        "expected": {"delivered": sums["delivered"], "lost": sums["lost"],
                     "duplicated": sums["duplicated"], "pending": 0, "lost_in_transit": 0,
                     "changed": 0, "reordered": 0},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=10_000_000,
                    help="about how many records (default %(default)s)")
    ap.add_argument("--out", required=True, help="directory to write (emptied first)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=1000.0,
                    help="messages per second over all gateways (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=None, help="processes (default: CPUs)")
    args = ap.parse_args()
    manifest = generate(args.records, Path(args.out), args.seed, args.rate, args.jobs)
    print(json.dumps(manifest), file=sys.stdout)


if __name__ == "__main__":
    main()
