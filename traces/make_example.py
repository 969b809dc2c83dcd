"""Writes traces/example.jsonl: a small, seeded mix of the steps a GPT-OSS-120B server with EAGLE
runs on one sliding-window layer (decode of 32 requests at mixed contexts, verify of 4 drafts, a
chunked prefill of 2048 tokens beside short extends), the format `swabench replay` reads.  A real
trace is dumped the same way from a server: one line per forward step, with each request's cached
prefix and the tokens it adds.  Usage: python traces/make_example.py"""

import json
import random
from pathlib import Path

rng = random.Random(0)
contexts = [[rng.randint(1024, 16384) for _ in range(32)] for _ in range(2)]  # two batches in flight
steps = []
for i in range(200):
    batch = contexts[i % 2]
    if i % 50 == 49:  # a chunked prefill joins now and then
        steps.append({"mode": "extend", "model": "gpt-oss-120b", "requests": [[0, 2048], [6144, 512]]})
    elif i % 4 == 3:  # EAGLE verify of 4 drafts for the same requests
        steps.append({"mode": "verify", "model": "gpt-oss-120b", "requests": [[c, 4] for c in batch]})
    else:
        steps.append({"mode": "decode", "model": "gpt-oss-120b", "requests": [[c, 1] for c in batch]})

out = Path(__file__).with_name("example.jsonl")
out.write_text("".join(json.dumps(s) + "\n" for s in steps))
print(f"{out}: {len(steps)} steps")
