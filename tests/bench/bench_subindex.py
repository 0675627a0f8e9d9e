"""Benchmark of gateway.subindex: match on cache hits and misses, insert and remove.

Run as a script: ``python tests/bench/bench_subindex.py [--subs N] [--seed S]``. Not a test:
it asserts nothing about time; it prints operations per second.

The subscription mix (nats ``Benchmark_*SublistMatch*`` in spirit): 80% literal names of 3-5
elements, 10% with one ``*`` element, 10% ending in ``>`` (half of those with MQTT parent
match). Elements come from a small vocabulary per level so names share prefixes, as real
topic trees do. Published subjects are half names that have a literal subscriber and half
random names from the same vocabulary.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.subindex import SubIndex  # noqa: E402
from gateway.subject import matches  # noqa: E402

VOCAB = [[f"l{level}e{i}" for i in range(size)] for level, size in enumerate([8, 20, 30, 30, 30])]


def random_literal(rng: random.Random) -> list[str]:
    n = rng.randint(3, 5)
    return [rng.choice(VOCAB[level]) for level in range(n)]


def make_patterns(rng: random.Random, count: int) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    for _ in range(count):
        els = random_literal(rng)
        r = rng.random()
        pm = False
        if r < 0.10:
            els[rng.randrange(len(els))] = "*"
        elif r < 0.20:
            cut = rng.randint(2, len(els) - 1)
            els = [*els[:cut], ">"]
            pm = rng.random() < 0.5
        out.append((".".join(els), pm))
    return out


def rate(label: str, ops: int, fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    per_s = ops / dt
    print(f"  {label:<48} {per_s:>14,.0f} ops/s  ({dt * 1e9 / ops:8.0f} ns/op)")
    return per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--subs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    patterns = make_patterns(rng, args.subs)
    subs = [object() for _ in patterns]
    literals = [p for p, _ in patterns if "*" not in p and ">" not in p]
    subjects = [
        rng.choice(literals) if rng.random() < 0.5 else ".".join(random_literal(rng))
        for _ in range(200_000)
    ]
    print(
        f"python {sys.version.split()[0]}; {len(patterns)} subscriptions "
        f"({len(literals)} literal), {len(set(subjects))} distinct subjects"
    )

    print("insert / remove")
    idx = SubIndex()

    def do_insert() -> None:
        ins = idx.insert
        for (p, pm), s in zip(patterns, subs, strict=True):
            ins(p, s, parent_match=pm)

    def do_remove() -> None:
        rem = idx.remove
        for (p, pm), s in zip(patterns, subs, strict=True):
            rem(p, s, parent_match=pm)

    rate(f"insert {len(patterns)} (incl. name validation)", len(patterns), do_insert)
    nodes_patterns = len(idx.patterns())
    rate(f"remove {len(patterns)}", len(patterns), do_remove)
    assert len(idx) == 0
    do_insert()
    print(f"  {nodes_patterns} distinct patterns")

    sizes = [len(idx.match(s)) for s in subjects[:10_000]]
    print(
        f"match results: mean {sum(sizes) / len(sizes):.2f} subs, "
        f"{sum(1 for n in sizes if n == 0) / len(sizes):.0%} empty"
    )

    print("match")
    hot = subjects[:1000]
    for s in hot:
        idx.match(s)
    reps = 200

    def do_hits() -> None:
        m = idx.match
        for _ in range(reps):
            for s in hot:
                m(s)

    rate("cache hit (1,000 hot subjects, cache 4096)", reps * len(hot), do_hits)

    cold = SubIndex(cache_size=0)
    for (p, pm), sub in zip(patterns, subs, strict=True):
        cold.insert(p, sub, parent_match=pm)

    def do_miss() -> None:
        m = cold.match
        for s in subjects:
            m(s)

    rate("cache miss (cache disabled, trie walk)", len(subjects), do_miss)

    def do_churn() -> None:
        m = idx.match
        for s in subjects:
            m(s)

    idx._cache.clear()
    rate("cache churn (cache 4096, ~all subjects distinct)", len(subjects), do_churn)

    sample = subjects[:100]
    plain = [p for p, _ in patterns]

    def do_brute() -> None:
        for s in sample:
            [p for p in plain if matches(p, s)]

    rate("reference: brute force over every pattern", len(sample), do_brute)

    print("has_interest")
    wild = [".".join([*random_literal(rng)[:2], "*"]) for _ in range(10_000)]

    def do_interest() -> None:
        h = cold.has_interest
        for w in wild:
            h(w)

    rate("has_interest(pattern) 'a.b.*'", len(wild), do_interest)


if __name__ == "__main__":
    main()
