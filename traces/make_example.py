"""Writes traces/example.jsonl: a small, seeded mix of the steps a Gemma-3-27B server with EAGLE runs
on one sliding-window layer (decode of 32 requests whose contexts grow every step, verify of 4 drafts,
a chunked prefill of 2048 tokens beside a short extend), in the format `swabench replay` reads.  A real
trace is dumped the same way from a server: one line per forward step, with each request's cached
prefix and the tokens it adds, rounded up to a bucket so that steps which differ by a few tokens are
one step (a server would round to 256; 4096 keeps this example at 9 distinct steps).  Usage: python traces/make_example.py"""

import json
import random
from collections import Counter
from pathlib import Path

BUCKET = 4096
rng = random.Random(0)
contexts = [[rng.randint(1024, 16384) for _ in range(32)] for _ in range(2)]  # two batches in flight


def bucket(n: int) -> int:
    return -(-n // BUCKET) * BUCKET


steps = Counter()
for i in range(200):
    batch = contexts[i % 2]
    if i % 50 == 49:  # a chunked prefill joins now and then
        step = ("extend", ((0, 2048), (6144, 512)))
    elif (i // 2) % 4 == 3:  # every 4th step of each batch: EAGLE verify of 4 drafts, 1 to 5 tokens kept
        step = ("verify", tuple((bucket(c), 4) for c in batch))
        batch[:] = [c + rng.randint(1, 5) for c in batch]
    else:
        step = ("decode", tuple((bucket(c), 1) for c in batch))
        batch[:] = [c + 1 for c in batch]
    steps[step] += 1

out = Path(__file__).with_name("example.jsonl")
out.write_text("".join(json.dumps({"mode": mode, "model": "gemma-3-27b", "requests": [list(r) for r in requests],
                                   "count": n}) + "\n" for (mode, requests), n in steps.items()))
print(f"{out}: {len(steps)} distinct steps, {sum(steps.values())} in all")
