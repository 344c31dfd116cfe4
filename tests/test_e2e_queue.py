"""The queue (SPEC §18) in front of the real demo llama.cpp with one slot: a batch key's
four prompts at once (the first a long one, which holds the slot while the others wait),
then one interactive question from another client: the question is served next (after the
prompt in progress), nothing beyond the slot is sent to the server, and the batch requests
are all answered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.config import ModelConfig
from proxy.demo import DEMO_MODEL
from tests.client import CHAT, request
from tests.conftest import RunningGateway, admin_headers
from tests.test_e2e_llama import gguf, managed_gateway  # noqa: F401 (a fixture)
from tests.waits import settled

pytest.importorskip("xllamacpp")

LONG = " ".join(f"Item {i}: the {i}th line of a long report about rivers and towns."
                for i in range(30))  # about 500 tokens of prefill


BATCH = 4  # the batch job's prompts: one served, three waiting when the question comes


async def one_slot_gateway(nursery: trio.Nursery, short_tmp: Path, gguf: Path  # noqa: F811
                           ) -> RunningGateway:
    return await managed_gateway(nursery, short_tmp, ModelConfig(
        name=DEMO_MODEL, path=str(gguf), context=2048, parallel=1, threads=1, preload=True))


def ask(text: str, tokens: int) -> bytes:
    return json.dumps({"model": DEMO_MODEL, "max_tokens": tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": text}]}).encode()


async def test_a_question_goes_before_a_batch_jobs_waiting_prompts(
        nursery: trio.Nursery, short_tmp: Path, gguf: Path) -> None:  # noqa: F811
    gw = await one_slot_gateway(nursery, short_tmp, gguf)
    made = await request(gw.unix, "POST", "/api/v1/access-keys",
                         b'{"name": "batch-job", "priority": "batch"}', admin_headers(gw))
    assert made.status == 201, made.body
    batch = [("authorization", f"Bearer {made.json()['key']}")]
    finished: list[str] = []
    replies: dict[str, Any] = {}
    most_in_flight = 0

    async def send(label: str, body: bytes, headers: list[tuple[str, str]] | None) -> None:
        replies[label] = await request(gw.unix, "POST", CHAT, body, headers)
        finished.append(label)

    async def watch() -> None:
        nonlocal most_in_flight
        while True:
            doc = (await request(gw.unix, "GET", "/api/v1/queue",
                                 headers=admin_headers(gw))).json()
            for line in doc["models"]:
                assert line["slots"] == 1
                most_in_flight = max(most_in_flight, line["inFlight"])
            await trio.sleep(0.2)

    with trio.fail_after(300):
        async with trio.open_nursery() as inner:
            watcher = trio.CancelScope()

            async def watching() -> None:
                with watcher:
                    await watch()

            inner.start_soon(watching)
            async with trio.open_nursery() as senders:
                for i in range(BATCH):  # the first holds the slot while the rest queue
                    text = f"{LONG} Summarise part {i}." if i == 0 else f"Summarise part {i}."
                    senders.start_soon(send, f"batch{i}", ask(text, 4), batch)
                    await trio.sleep(0.05)  # they come in this order
                scheduler = gw.gateway.ctx.scheduler
                await settled(lambda: sum(len(line.waiting) for line in scheduler.snapshot())
                              == BATCH - 1, "the batch's prompts waiting behind the one served")
                senders.start_soon(send, "question", ask("What colour is the sky?", 8),
                                   [("x-sluice-session", "a person")])
            watcher.cancel()
    assert all(r.status == 200 for r in replies.values()), \
        {k: r.status for k, r in replies.items()}
    # Served next: at most the prompt that had the slot when it came finished before it.
    assert finished.index("question") <= 1, finished
    assert most_in_flight == 1
    assert int(replies["question"].header("x-sluice-queue-ms") or 0) > 0
    entries = (await request(gw.unix, "GET", "/api/v1/requests",
                             headers=admin_headers(gw))).json()["requests"]
    classes = sorted(e["priority"] for e in entries if e["path"] == CHAT)
    assert classes == ["batch"] * BATCH + ["interactive"]
