"""Writes traces/example.jsonl and traces/small.jsonl: small, seeded mixes of the steps a Gemma-3-27B server with
EAGLE runs on one sliding-window layer (decode of a batch whose contexts grow every step, verify of 4 drafts, now and
then a chunked prefill beside a short extend), in the format `swabench replay` reads.  example.jsonl is a GPU's
(32 requests of up to 16k keys); small.jsonl is the same mix cut to what a CPU gates and times in minutes (2 requests
of up to 3k keys, past the model's window of 1024, and a 128-token prefill chunk).  A real trace is dumped the same way from a server: one line per
forward step, with each request's cached prefix and the tokens it adds, rounded up to a bucket so that steps which
differ by a few tokens are one step (a server would round to 256; the buckets here keep each example to a few
distinct steps).  Usage: python traces/make_example.py"""

import json
import random
from collections import Counter
from pathlib import Path


def mix(batch: int, longest: int, bucket: int, prefill: tuple, steps: int = 200) -> Counter:
    """The steps of two batches of ``batch`` requests in flight (contexts from 1024 to ``longest`` keys, rounded up
    to ``bucket``), a ``prefill`` (its requests' prefix and tokens) every 50th step."""
    rng = random.Random(0)
    contexts = [[rng.randint(1024, longest) for _ in range(batch)] for _ in range(2)]
    seen = Counter()
    for i in range(steps):
        batch_now = contexts[i % 2]
        if i % 50 == 49:  # a chunked prefill joins now and then
            step = ("extend", prefill)
        elif (i // 2) % 4 == 3:  # every 4th step of each batch: EAGLE verify of 4 drafts, 1 to 5 tokens kept
            step = ("verify", tuple((-(-c // bucket) * bucket, 4) for c in batch_now))
            batch_now[:] = [c + rng.randint(1, 5) for c in batch_now]
        else:
            step = ("decode", tuple((-(-c // bucket) * bucket, 1) for c in batch_now))
            batch_now[:] = [c + 1 for c in batch_now]
        seen[step] += 1
    return seen


def write(name: str, steps: Counter) -> None:
    out = Path(__file__).with_name(name)
    out.write_text("".join(json.dumps({"mode": mode, "model": "gemma-3-27b", "requests": [list(r) for r in requests],
                                       "count": n}) + "\n" for (mode, requests), n in steps.items()))
    print(f"{out}: {len(steps)} distinct steps, {sum(steps.values())} in all")


write("example.jsonl", mix(32, 16384, 4096, ((0, 2048), (6144, 512))))
write("small.jsonl", mix(2, 3072, 1024, ((0, 128), (1024, 32))))
