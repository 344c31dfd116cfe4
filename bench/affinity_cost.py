"""What cache-aware routing's index costs (SPEC §15, issue 33), in one process:

- **memory at 100k indexed blocks**: a PrefixIndex filled with conversations (chains of
  ``block_chars`` 512 blocks) until it holds 100,000 (block, candidate) pairs, measured
  with tracemalloc (what the index itself allocates) and as the process's RSS growth;
- **CPU per request**: what the router adds to one request of a multi-turn chat: the
  prompt's canonical text (``protocol.affinity.prompt_text``), its prefix chain, the
  longest-match look-up over two candidates and the record of the answer, on the body of
  S12's 6th turn (a ~350-word shared system prompt, a ~250-word document, 5 turns before),
  timed over many calls; the median of the rounds.

    .venv/bin/python bench/affinity_cost.py [--rounds 7] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.affinity import chain, prompt_text
from protocol.prefix_index import PrefixIndex

BLOCK_CHARS = 512  # load_balancing.affinity.block_chars' default
PAIRS = 100_000
WORDS = ("model", "server", "cache", "token", "prompt", "answer", "gateway", "router",
         "memory", "socket", "stream", "thread", "kernel", "buffer", "packet", "latency")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(rng: random.Random, system: str, turns: int) -> dict[str, object]:
    """S12's shape: a shared system prompt, a private document, then ``turns`` turns."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Read this document.\n" + words(rng, 250)}]
    for _ in range(turns):
        messages.append({"role": "assistant", "content": words(rng, 16)})
        messages.append({"role": "user", "content": words(rng, 40)})
    return {"model": "smol", "stream": True, "max_tokens": 16, "messages": messages}


def rss() -> int:
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def memory_at(pairs: int) -> dict[str, float]:
    rng = random.Random(7)
    system = words(rng, 350)
    before_rss = rss()
    tracemalloc.start()
    index = PrefixIndex(pairs)
    conversations = 0
    while len(index) < pairs:
        body = conversation(rng, system, 6)
        text = prompt_text("/v1/chat/completions", body) or ""
        index.record("smol", chain("smol", text, BLOCK_CHARS), f"node-{conversations % 2}")
        conversations += 1
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"pairs": len(index), "blocks": index.blocks, "conversations": conversations,
            "tracemalloc_mb": current / 1e6, "rss_growth_mb": (rss() - before_rss) / 1e6}


def per_request_us(calls: int, rounds: int) -> dict[str, float]:
    rng = random.Random(11)
    system = words(rng, 350)
    index = PrefixIndex(200_000)
    bodies = [json.loads(json.dumps(conversation(rng, system, 5))) for _ in range(50)]
    for i, body in enumerate(bodies):  # the earlier turns, as the index would have them
        text = prompt_text("/v1/chat/completions", body) or ""
        index.record("smol", chain("smol", text, BLOCK_CHARS)[:-2], f"node-{i % 2}")
    candidates = ("node-0", "node-1")
    samples = []
    for _ in range(rounds):
        started = time.process_time()
        for n in range(calls):
            body = bodies[n % len(bodies)]
            text = prompt_text("/v1/chat/completions", body) or ""
            keys = chain("smol", text, BLOCK_CHARS)
            found = index.matches("smol", keys, candidates)
            best = max(found, key=lambda name: found[name])
            index.record("smol", keys, best)
        samples.append((time.process_time() - started) / calls * 1e6)
    text = prompt_text("/v1/chat/completions", bodies[0]) or ""
    return {"median_us": statistics.median(samples), "min_us": min(samples),
            "max_us": max(samples), "prompt_chars": len(text),
            "blocks": len(chain("smol", text, BLOCK_CHARS))}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    mem = memory_at(PAIRS)
    cpu = per_request_us(args.calls, args.rounds)
    print(f"index at {mem['pairs']:,} (block, candidate) pairs ({mem['blocks']:,} blocks, "
          f"{mem['conversations']:,} conversations): {mem['tracemalloc_mb']:.1f} MB "
          f"allocated, RSS +{mem['rss_growth_mb']:.1f} MB")
    print(f"per request ({cpu['prompt_chars']:,} characters, {cpu['blocks']} blocks): "
          f"median {cpu['median_us']:.1f} µs CPU (rounds {cpu['min_us']:.1f}-"
          f"{cpu['max_us']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
