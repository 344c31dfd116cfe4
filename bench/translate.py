"""S3T — Messages translated to Chat Completions (issue 41, SPEC §17.1): what the
translation costs.

The issue's figure: the gateway CPU per chunk of S3's 100-chunk stream translated (a client
on ``/v1/messages``, the mock answering Chat Completions, the gateway writing Anthropic's
events) is at most :data:`CPU_MAX_RATIO` x the same stream relayed on
``/v1/chat/completions``, in one interleaved run; medians.

Three targets, the same mock stream (S3's: 100 events, no gap; 99 carry text, the last the
finish and the usage), interleaved per round (their order turns each round), over TCP and
the Unix socket, on one keep-alive connection per measurement (bench/ollama.py's client):

- ``direct``: S3's body to the mock itself, for reference;
- ``v1``: S3's body through the gateway on ``/v1/chat/completions``, relayed;
- ``messages``: a Messages request (``max_tokens`` 100, ``stream`` true) through the same
  gateway on ``/v1/messages``. The mock has no ``/v1/messages`` (404), so the gateway's
  ``apis: auto`` probe marks it ``translate``; the gateway sends it Chat Completions and
  writes ``message_start``, one text block of 99 ``text_delta`` events, ``message_delta``
  (the usage) and ``message_stop``. Every answer is checked whole.

The gateway's CPU (utime + stime) over each measurement, per stream; the ratio messages /
v1 of the medians and the median of the per-round ratios; TTFL (first whole event) p50.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.ollama import (
    MESSAGES,
    PROMPT_TOKENS,
    Client,
    Cut,
    _median,
    _minus,
    _pct,
    _ratio,
    check_sse,
    expected_text,
    interleaved,
)

SHAPE = {"chunks": 100, "count": 300}  # S3's
SMOKE_COUNT = 50
WARM_UP = 30
TIME_LIMIT_S = 60.0
TARGETS = ("direct", "v1", "messages", "responses")
TRANSLATED = ("messages", "responses")
CPU_MAX_RATIO = 2.0
TARGET_TEXT = f"translated CPU/stream ≤ x{CPU_MAX_RATIO:g} v1's (relayed)"


def _base() -> Any:
    from bench import run as base

    return base


def request(target: str, model: str, chunks: int) -> tuple[str, bytes]:
    if target == "responses":
        return "/v1/responses", json.dumps({
            "model": model, "max_output_tokens": chunks, "stream": True,
            "instructions": MESSAGES[0]["content"], "input": MESSAGES[1]["content"]}).encode()
    if target == "messages":
        return "/v1/messages", json.dumps({
            "model": model, "max_tokens": chunks, "stream": True,
            "system": MESSAGES[0]["content"], "messages": MESSAGES[1:]}).encode()
    return "/v1/chat/completions", json.dumps({
        "model": model, "messages": MESSAGES, "max_tokens": chunks, "stream": True,
        "bench_chunks": chunks, "bench_gap_ms": 0}).encode()


def named_events(body: bytes) -> list[tuple[str, Any]] | None:
    """A stream of named SSE events as (name, parsed data) pairs; None when one is not
    JSON."""
    events = []
    for block in body.decode("utf-8", "replace").split("\n\n")[:-1]:
        name, _, data = block.partition("\ndata: ")
        try:
            events.append((name.removeprefix("event: "), json.loads(data)))
        except ValueError:
            return None
    return events


def check_messages(body: bytes, chunks: int, model: str) -> str | None:
    """What is wrong with a translated Messages stream (None: nothing)."""
    events = named_events(body)
    if events is None:
        return "an event that is not JSON"
    names = [n for n, _ in events]
    want = ["message_start", "content_block_start", *["content_block_delta"] * (chunks - 1),
            "content_block_stop", "message_delta", "message_stop"]
    if names != want:
        return f"events {names[:4]}...{names[-3:]} ({len(names)})"
    if events[0][1]["message"]["model"] != model:
        return "message_start names another model"
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    if text != expected_text(chunks):
        return f"the text differs from the mock's: {text[:60]!r}..."
    usage = events[-2][1]["usage"]
    if (usage["input_tokens"], usage["output_tokens"]) != (PROMPT_TOKENS, chunks):
        return f"usage {usage}"
    return None


def check_responses(body: bytes, chunks: int, model: str) -> str | None:
    """What is wrong with a translated Responses stream (None: nothing)."""
    events = named_events(body)
    if events is None:
        return "an event that is not JSON"
    names = [n for n, _ in events]
    if names[:2] != ["response.created", "response.in_progress"] \
            or names[-1] != "response.completed":
        return f"events {names[:3]}...{names[-2:]}"
    if names.count("response.output_text.delta") != chunks - 1:
        return f"{names.count('response.output_text.delta')} text deltas"
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    if text != expected_text(chunks):
        return f"the text differs from the mock's: {text[:60]!r}..."
    done = events[-1][1]["response"]
    usage = done.get("usage") or {}
    if done.get("model") != model or (usage.get("input_tokens"), usage.get("output_tokens")) \
            != (PROMPT_TOKENS, chunks):
        return f"response.completed: model {done.get('model')}, usage {usage}"
    return None


def measure_one(env: dict[str, Any], target: str, transport: str, count: int,
                chunks: int) -> dict[str, Any]:
    base = _base()
    gateway = env["sluice"]
    addr = {transport: (env["mock"] if target == "direct" else gateway)[transport]}
    model = f"bench-{transport}"
    path, body = request(target, model, chunks)
    pids = [] if target == "direct" else gateway["pids"]
    answers: list[dict[str, Any]] = []
    errors: dict[str, int] = {}
    started = 0
    client = Client(addr)
    cpu0, t0 = base.cpu_seconds(pids), time.monotonic()
    try:
        while started < count and time.monotonic() - t0 < TIME_LIMIT_S:
            started += 1
            try:
                answers.append(client.stream(path, body, b"\n\n"))
            except (OSError, Cut, ValueError) as err:
                errors[type(err).__name__ + ": " + str(err)[:80]] = 1
                break
    finally:
        client.close()
    wall = time.monotonic() - t0
    cpu = base.cpu_seconds(pids) - cpu0 if pids else None
    completed = 0
    for a in answers:
        if a["status"] != 200:
            problem: str | None = f"status {a['status']}: {a['body'][:200]!r}"
        elif target == "messages":
            problem = check_messages(a["body"], chunks, model)
        elif target == "responses":
            problem = check_responses(a["body"], chunks, model)
        else:
            problem = check_sse(a["body"], chunks)
        if problem is None:
            completed += 1
        else:
            errors[problem] = errors.get(problem, 0) + 1
    ttfl = [a["ttfl"] for a in answers if a["ttfl"] is not None]
    return {"started": started, "completed": completed, "count": count, "errors": errors,
            "proxy_cpu_s": None if cpu is None else round(cpu, 3),
            "cpu_ms_per_stream": None if cpu is None or not completed else
            round(cpu * 1000 / completed, 4),
            "ttfl_p50": _pct(ttfl, 50), "wall_s": round(wall, 3)}


def run_s3t(env: dict[str, Any], transports: list[str], rounds: int,
            smoke: bool) -> dict[str, Any]:
    count, chunks = (SMOKE_COUNT if smoke else SHAPE["count"]), SHAPE["chunks"]
    runs, problems = interleaved(
        "S3T", TARGETS, transports, rounds, count, 5 if smoke else WARM_UP,
        lambda tg, tr, n: measure_one(env, tg, tr, n, chunks))
    return {"shape": {**SHAPE, "count": count}, "targets": list(TARGETS),
            "summary": summarise(runs, transports), "problems": problems, "runs": runs}


def summarise(runs: list[dict[str, Any]], transports: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tr in transports:
        by = {(r["round"], r["target"]): r for r in runs if r["transport"] == tr}
        rounds = sorted({k for k, _ in by})
        med = {tg: {key: _median([by[(k, tg)][key] for k in rounds if (k, tg) in by])
                    for key in ("cpu_ms_per_stream", "ttfl_p50", "wall_s")}
               for tg in TARGETS}
        entry: dict[str, Any] = {"median": med, "complete": all(
            r["completed"] == r["count"] and not r["errors"] for r in by.values())}
        met = True
        for tg in TRANSLATED:
            pairs = [(by[(k, tg)], by[(k, "v1")]) for k in rounds
                     if (k, tg) in by and (k, "v1") in by]
            ratio = _median([_ratio(m["cpu_ms_per_stream"], v["cpu_ms_per_stream"])
                             for m, v in pairs])
            entry[tg] = {"rounds": len(pairs), "cpu_ratio": ratio,
                         "cpu_ratio_of_medians": _ratio(med[tg]["cpu_ms_per_stream"],
                                                        med["v1"]["cpu_ms_per_stream"]),
                         "ttfl_added_ms": _median([_minus(m["ttfl_p50"], v["ttfl_p50"])
                                                   for m, v in pairs])}
            met = met and ratio is not None and ratio <= CPU_MAX_RATIO
        entry["met"] = met
        out[tr] = entry
    return out


def table(s3t: dict[str, Any], smoke: bool) -> str:
    base = _base()
    fmt = base.fmt
    head = ["S3T", "Transport", "Translated to", "CPU/stream v1", "CPU/stream translated",
            "translated / v1 (paired; of medians)", "TTFL p50 v1", "TTFL p50 translated",
            "Delivered", "Issue target", "Met"]
    rows = []
    for tr, e in s3t["summary"].items():
        m = e["median"]
        met = "—" if smoke else ("met" if e["met"] and e["complete"] else "not met")
        for tg in TRANSLATED:
            t = e[tg]
            rows.append([
                f"S3T (x{t['rounds']})", tr, tg, f"{fmt(m['v1']['cpu_ms_per_stream'])} ms",
                f"{fmt(m[tg]['cpu_ms_per_stream'])} ms",
                f"x{fmt(t['cpu_ratio'])}; x{fmt(t['cpu_ratio_of_medians'])}",
                f"{fmt(m['v1']['ttfl_p50'])} ms", f"{fmt(m[tg]['ttfl_p50'])} ms",
                "all" if e["complete"] else "INCOMPLETE", TARGET_TEXT, met])
    return str(base.markdown(head, rows))
