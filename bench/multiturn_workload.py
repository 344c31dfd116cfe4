"""S12's client: each user a thread that holds one conversation, sends every turn as a
streamed Chat Completions request (the whole history again) and records, per turn, the time
to the first data event with content (TTFT, measured here, at the client), the answer's
end, who served it (``x-sluice-served-by``, else the target's name), the gateway's
``x-sluice-affinity``, and the prompt and reused (cached) tokens from the final usage chunk
(llama.cpp's ``timings`` when usage has no ``cached_tokens``). Also the two controls'
loads: fresh conversations only (negative), and one conversation sending most requests
(hotspot). Standard library only; every request bounded in time."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from bench import multiturn_texts as texts

REQUEST_TIMEOUT = 180.0  # one turn, start to end (the 8-user queues take seconds, not minutes)
Target = Callable[[int], dict[str, str]]  # user -> address ({"unix": path} or {"tcp": h:p})


def _connection(target: dict[str, str], timeout: float = REQUEST_TIMEOUT
                ) -> http.client.HTTPConnection:
    from bench.run import UnixHTTPConnection  # (bench.run imports S12 lazily: no cycle)

    if "unix" in target:
        return UnixHTTPConnection(target["unix"], timeout)
    host, port = target["tcp"].rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def _usage(event: dict[str, Any], turn: dict[str, Any]) -> None:
    usage = event.get("usage")
    timings = event.get("timings")
    if isinstance(usage, dict):
        turn["prompt_tokens"] = usage.get("prompt_tokens")
        turn["completion_tokens"] = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            turn["cached_tokens"] = details["cached_tokens"]
    if isinstance(timings, dict) and turn.get("cached_tokens") is None:
        turn["cached_tokens"] = timings.get("cache_n")
        if turn.get("prompt_tokens") is None and timings.get("prompt_n") is not None:
            turn["prompt_tokens"] = timings["prompt_n"] + (timings.get("cache_n") or 0)


def stream_turn(target: dict[str, str], name: str, messages: list[dict[str, str]],
                max_tokens: int, t0: float, headers: dict[str, str] | None = None,
                timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
    """Send one streamed turn (with ``headers`` besides the content type); its record
    (times in seconds, ``start``/``end`` since ``t0``), and the answer's text under
    ``answer``; ``timeout`` bounds it, start to end."""
    turn: dict[str, Any] = {"status": None, "ttft_s": None, "total_s": None,
                            "served_by": name, "affinity": None, "prompt_tokens": None,
                            "cached_tokens": None, "completion_tokens": None, "events": 0,
                            "done": False, "error": None, "answer": ""}
    conn = _connection(target, timeout)
    pieces: list[str] = []
    start = time.monotonic()
    turn["start"] = round(start - t0, 4)
    try:
        conn.request("POST", "/v1/chat/completions", body=texts.body(messages, max_tokens),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        turn["status"] = resp.status
        turn["served_by"] = resp.getheader("x-sluice-served-by") or name
        turn["affinity"] = resp.getheader("x-sluice-affinity")
        if resp.status != 200:
            turn["error"] = resp.read()[:300].decode(errors="replace")
            return turn
        turn["queue_ms"] = resp.getheader("x-sluice-queue-ms")
        while time.monotonic() - start < timeout:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                turn["done"] = True
                resp.read()  # the rest of the body, to its end, as the OpenAI SDK does
                break
            event = json.loads(data)
            turn["events"] += 1
            if "error" in event:
                turn["error"] = str(event["error"])[:300]
                break
            for choice in event.get("choices") or ():
                text = (choice.get("delta") or {}).get("content")
                if text:
                    if turn["ttft_s"] is None:
                        turn["ttft_s"] = round(time.monotonic() - start, 4)
                    pieces.append(text)
            _usage(event, turn)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        turn["error"] = repr(exc)[:300]
    finally:
        end = time.monotonic()
        turn["total_s"] = round(end - start, 4)
        turn["end"] = round(end - t0, 4)
        conn.close()
    turn["answer"] = "".join(pieces)
    return turn


def _run_threads(work: list[Callable[[], None]], deadline_s: float) -> None:
    threads = [threading.Thread(target=w, daemon=True) for w in work]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        t.join(max(0.1, end - time.monotonic()))


def conversations(target: Target, name_of: Callable[[int], str], users: int, turns: int,
                  max_tokens: int, deadline_s: float, scale: float = 1.0
                  ) -> list[dict[str, Any]]:
    """``users`` conversations at once, ``turns`` turns each, one after the other (the next
    turn right after the answer); every turn's record with ``user`` and ``turn`` (1-based)."""
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def user(u: int) -> None:
        chat = texts.Conversation(u, scale)
        for t in range(1, turns + 1):
            asked = chat.ask()
            rec = stream_turn(target(u), name_of(u), asked, max_tokens, t0)
            with lock:
                records.append({"user": u, "turn": t, **rec})
            if rec["status"] != 200 or not rec["done"]:
                return  # a broken conversation stops; the report counts what is missing
            chat.answered(asked, rec["answer"])

    _run_threads([lambda u=u: user(u) for u in range(users)], deadline_s)
    return sorted(records, key=lambda r: (r["user"], r["turn"]))


def negative(target: dict[str, str], users: int, requests: int, max_tokens: int,
             deadline_s: float, scale: float = 1.0) -> list[dict[str, Any]]:
    """The negative control: ``users`` clients at once, each sending ``requests`` requests one
    after the other, every one a new conversation sharing no prefix with any other."""
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def user(u: int) -> None:
        for n in range(1, requests + 1):
            rec = stream_turn(target, "", texts.fresh(f"{u}-{n}", scale), max_tokens, t0)
            with lock:
                records.append({"user": u, "turn": n, **rec})

    _run_threads([lambda u=u: user(u) for u in range(users)], deadline_s)
    return sorted(records, key=lambda r: (r["user"], r["turn"]))


def hotspot(target: dict[str, str], fan_out: int, others: int, turns: int, max_tokens: int,
            deadline_s: float, scale: float = 1.0) -> tuple[list[dict[str, Any]], float]:
    """The hotspot control: one conversation (user 0) sends ``fan_out`` requests at once every
    turn (the same history, different last questions; its history goes on with the first
    one's answer, as an agent's does), while ``others`` conversations take normal turns.
    The records (``hot`` True for user 0's) and the load's wall time."""
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def hot() -> None:
        chat = texts.Conversation(0, scale)
        for t in range(1, turns + 1):
            asks = [chat.ask(v) for v in range(fan_out)]
            got: list[dict[str, Any]] = [{} for _ in asks]

            def one(i: int, asks: list[list[dict[str, str]]] = asks,
                    got: list[dict[str, Any]] = got) -> None:
                got[i] = stream_turn(target, "", asks[i], max_tokens, t0)

            _run_threads([lambda i=i: one(i) for i in range(fan_out)], REQUEST_TIMEOUT)
            with lock:
                records.extend({"user": 0, "turn": t, "hot": True, **g} for g in got if g)
            if not got[0] or got[0]["status"] != 200 or not got[0]["done"]:
                return
            chat.answered(asks[0], got[0]["answer"])

    def other(u: int) -> None:
        chat = texts.Conversation(u, scale)
        for t in range(1, turns + 1):
            asked = chat.ask()
            rec = stream_turn(target, "", asked, max_tokens, t0)
            with lock:
                records.append({"user": u, "turn": t, "hot": False, **rec})
            if rec["status"] != 200 or not rec["done"]:
                return
            chat.answered(asked, rec["answer"])

    _run_threads([hot, *(lambda u=u: other(u) for u in range(1, others + 1))], deadline_s)
    return records, time.monotonic() - t0
