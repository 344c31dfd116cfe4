"""S11 — the Ollama API's streamed chat (issue 23): what the translation costs.

Issue 23's figure: an Ollama ``/api/chat`` stream of 100 events costs within
:data:`CPU_MAX_RATIO` x the gateway CPU of the same stream relayed on
``/v1/chat/completions`` (S3's shape), and adds under :data:`TTFL_MAX_ADDED_MS` to the time
to the first line; same run, medians.

Three targets, the same mock stream (S3's: 100 events, no gap; 99 carry text, the last the
finish and the usage), interleaved per round (their order turns each round), over TCP and
the Unix socket:

- ``direct``: S3's body to the mock itself (SSE), for reference;
- ``v1``: S3's body through the main gateway on ``/v1/chat/completions`` (SSE out: the
  chunks are relayed with their own framing);
- ``ollama``: an Ollama chat request (``options.num_predict`` 100, ``stream`` true) through
  the same gateway on ``/api/chat``. The gateway sends the mock an OpenAI request with
  ``stream_options.include_usage``; the mock ignores the fields it does not know and sends
  S3's stream, which the gateway translates to NDJSON event by event: 99 lines of text and
  the last line (``done: true``, the counts).

A measurement is :data:`SHAPE`'s ``count`` streams, one after another on one keep-alive
connection, by a client in this process (blocking sockets, the same code for every
target), bounded by :data:`TIME_LIMIT_S`. Per stream it takes the time from the request's
first byte sent to its first body byte (TTFB), to its first whole line — the first NDJSON
line, or the first SSE event (up to its blank line) — (TTFL), and to its end. Every stream
is checked whole: SSE bodies all alike and equal to direct's (sha256); NDJSON bodies 100
lines of JSON, their text the mock's, the last one done with ``eval_count`` 100. The
gateway's CPU (utime + stime, /proc) over the measurement, per stream.

Per transport: medians over rounds of each target's CPU per stream and TTFL p50, the
ratio ollama / v1 (of the medians, and the median of the per-round ratios) and the TTFL
difference ollama - v1 (of the medians, and the median of the per-round differences). The
target is judged on the paired medians.
"""

from __future__ import annotations

import hashlib
import json
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

SHAPE = {"chunks": 100, "count": 300}  # S3's
SMOKE_COUNT = 50
WARM_UP = 30  # streams per target and transport before the first round
TIME_LIMIT_S = 60.0  # one measurement stops starting streams after this long
SOCKET_TIMEOUT_S = 10.0
TARGETS = ("direct", "v1", "ollama")
CPU_MAX_RATIO = 1.5
TTFL_MAX_ADDED_MS = 0.5
TARGET_TEXT = (f"ollama CPU/stream ≤ x{CPU_MAX_RATIO:g} v1's; TTFL p50 ≤ v1's "
               f"+{TTFL_MAX_ADDED_MS:g} ms")
MESSAGES = [  # bench/load.js's
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write a short greeting for the benchmark."},
]
PROMPT_TOKENS = 24  # the mock's usage


def _base() -> Any:
    """bench/run.py's helpers (imported here: run.py imports this module)."""
    from bench import run as base

    return base


def request(target: str, model: str, chunks: int) -> tuple[str, bytes]:
    """The path and body of one stream request to ``target``."""
    if target == "ollama":
        return "/api/chat", json.dumps({
            "model": model, "messages": MESSAGES, "stream": True,
            "options": {"num_predict": chunks}}).encode()
    return "/v1/chat/completions", json.dumps({  # S3's, as bench/load.js sends it
        "model": model, "messages": MESSAGES, "max_tokens": chunks, "stream": True,
        "bench_chunks": chunks, "bench_gap_ms": 0}).encode()


def expected_text(chunks: int) -> str:
    """The text of the mock's stream (bench/mock_upstream.js: ``tok<k> ``, the last event
    has none)."""
    return "".join(f"tok{k} " for k in range(chunks - 1))


# -- the client ------------------------------------------------------------------------------

class Cut(Exception):
    """The answer was not whole (the connection closed, bad framing, a timeout)."""


class Client:
    """One keep-alive HTTP/1.1 connection (TCP or Unix socket) that times streamed answers."""

    def __init__(self, addr: dict[str, str]) -> None:
        if "unix" in addr:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(SOCKET_TIMEOUT_S)
            self.sock.connect(addr["unix"])
        else:
            host, port = addr["tcp"].split(":")
            self.sock = socket.create_connection((host, int(port)), SOCKET_TIMEOUT_S)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.extra = b""  # bytes read past the last answer (none, from a sound server)

    def close(self) -> None:
        self.sock.close()

    def _read(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise Cut("the connection closed")
        return data

    def stream(self, path: str, body: bytes, terminator: bytes) -> dict[str, Any]:
        """One request; its status, body and times (ms): ``ttfb``, ``ttfl`` (the body held
        ``terminator`` first) and ``total``."""
        head = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        clock = time.perf_counter
        t0 = clock()
        self.sock.sendall(head + body)
        buf = self.extra
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf += self._read()
        lines = buf[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in
                  (line.partition(":") for line in lines[1:])}
        buf = buf[end + 4:]
        out = bytearray()
        ttfb = ttfl = None
        if "chunked" in fields.get("transfer-encoding", "").lower():
            reader = Dechunk()
            while True:
                if buf:
                    reader.feed(buf, out)
                    buf = b""
                    if out:
                        now = clock()
                        ttfb = ttfb if ttfb is not None else now
                        if ttfl is None and terminator in out:
                            ttfl = now
                    if reader.done:
                        break
                buf = self._read()
            self.extra = reader.leftover
        else:
            length = int(fields.get("content-length", "0"))
            while len(buf) < length:
                buf += self._read()
            out += buf[:length]
            self.extra = buf[length:]
            ttfb = ttfl = clock()
        t1 = clock()
        ms = 1000.0
        return {"status": status, "type": fields.get("content-type", ""), "body": bytes(out),
                "ttfb": None if ttfb is None else (ttfb - t0) * ms,
                "ttfl": None if ttfl is None else (ttfl - t0) * ms, "total": (t1 - t0) * ms}


class Dechunk:
    """An incremental chunked-body decoder: :meth:`feed` appends the payload to ``out``."""

    def __init__(self) -> None:
        self.buf = b""
        self.state = "size"  # size line, data, the CRLF after data, the last chunk's CRLF
        self.left = 0  # bytes of the current chunk still to come
        self.done = False
        self.leftover = b""  # bytes after the body

    def feed(self, data: bytes, out: bytearray) -> None:
        buf, at = self.buf + data, 0
        while not self.done:
            if self.state == "size":
                eol = buf.find(b"\r\n", at)
                if eol < 0:
                    break
                size = int(buf[at:eol].split(b";", 1)[0], 16)
                at = eol + 2
                self.state, self.left = ("data", size) if size else ("last", 0)
            elif self.state == "data":
                take = min(self.left, len(buf) - at)
                out += buf[at:at + take]
                at += take
                self.left -= take
                if self.left:
                    break
                self.state = "crlf"
            else:  # "crlf" or "last": two bytes, CRLF (no trailers from these servers)
                if len(buf) - at < 2:
                    break
                if buf[at:at + 2] != b"\r\n":
                    raise Cut("bad chunked framing")
                at += 2
                self.done = self.state == "last"
                self.state = "size"
        if self.done:
            self.buf, self.leftover = b"", buf[at:]
        else:
            self.buf = buf[at:]


# -- checks ----------------------------------------------------------------------------------

def check_ndjson(body: bytes, chunks: int, model: str) -> str | None:
    """What is wrong with an NDJSON answer to S11's request (None: nothing): ``chunks - 1``
    lines of the mock's text, then the last line, done, with its counts."""
    if not body.endswith(b"\n"):
        return "the body does not end with a newline"
    try:
        docs = [json.loads(line) for line in body[:-1].split(b"\n")]
    except ValueError:
        return "a line that is not JSON"
    if len(docs) != chunks:
        return f"{len(docs)} lines, not {chunks}"
    *texts, last = docs
    if any(d.get("model") != model or d.get("done") is not False for d in texts):
        return "a line of text with another model or done"
    text = "".join(d.get("message", {}).get("content", "") for d in texts)
    if text != expected_text(chunks):
        return f"the text differs from the mock's: {text[:60]!r}..."
    want = {"done": True, "done_reason": "stop", "eval_count": chunks,
            "prompt_eval_count": PROMPT_TOKENS, "model": model,
            "message": {"role": "assistant", "content": ""}}
    got = {k: last.get(k) for k in want}
    return None if got == want else f"the last line: {got}"


def check_sse(body: bytes, chunks: int) -> str | None:
    if not body.endswith(b"data: [DONE]\n\n"):
        return "no data: [DONE] at the end"
    events = body.count(b"\n\n") - 1
    return None if events == chunks else f"{events} events, not {chunks}"


# -- measuring -------------------------------------------------------------------------------

def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, -(-len(ordered) * p // 100) - 1))
    return round(ordered[int(k)], 4)


def measure_one(env: dict[str, Any], target: str, transport: str, count: int,
                chunks: int) -> dict[str, Any]:
    """``count`` streams to ``target`` one after another on one connection (at most
    :data:`TIME_LIMIT_S`); the gateway's CPU over them; every answer checked after."""
    base = _base()
    gateway = env["sluice"]
    addr = {transport: (env["mock"] if target == "direct" else gateway)[transport]}
    model = f"bench-{transport}"
    path, body = request(target, model, chunks)
    terminator = b"\n" if target == "ollama" else b"\n\n"
    pids = [] if target == "direct" else gateway["pids"]
    answers: list[dict[str, Any]] = []
    errors: dict[str, int] = {}
    started = 0
    client = Client(addr)
    cpu0, mock0 = base.cpu_seconds(pids), base.cpu_seconds([env["mock"]["pid"]])
    client0, t0 = time.process_time(), time.monotonic()
    try:
        while started < count and time.monotonic() - t0 < TIME_LIMIT_S:
            started += 1
            try:
                answers.append(client.stream(path, body, terminator))
            except (OSError, Cut, ValueError) as err:
                errors[type(err).__name__ + ": " + str(err)[:80]] = 1
                break
    finally:
        client.close()
    wall = time.monotonic() - t0
    cpu = base.cpu_seconds(pids) - cpu0 if pids else None
    mock_cpu, client_cpu = base.cpu_seconds([env["mock"]["pid"]]) - mock0, \
        time.process_time() - client0
    for name, proc in env["sluice"]["procs"]:
        if proc["proc"].poll() is not None:
            raise RuntimeError(f"{name} exited ({proc['proc'].returncode}) during S11:\n"
                               f"{base.tail(proc['log'])}")
    digests: dict[str, int] = {}
    completed = 0
    for a in answers:
        if a["status"] != 200:
            problem: str | None = f"status {a['status']}: {a['body'][:200]!r}"
        elif target == "ollama":
            problem = (None if a["type"].startswith("application/x-ndjson") else
                       f"content-type {a['type']!r}") or check_ndjson(a["body"], chunks, model)
        else:
            problem = check_sse(a["body"], chunks)
            digest = hashlib.sha256(a["body"]).hexdigest()
            digests[digest] = digests.get(digest, 0) + 1
        if problem is None and a["ttfl"] is None:
            problem = "no whole line in the body"
        if problem is None:
            completed += 1
        else:
            errors[problem] = errors.get(problem, 0) + 1
    times = {key: [a[key] for a in answers if a[key] is not None]
             for key in ("ttfb", "ttfl", "total")}
    return {
        "started": started,
        "completed": completed, "count": count, "errors": errors, "digests": digests,
        "lines": None if not answers else answers[0]["body"].count(terminator),
        "proxy_cpu_s": None if cpu is None else round(cpu, 3),
        "cpu_ms_per_stream": None if cpu is None or not completed else
        round(cpu * 1000 / completed, 4),
        "ttfb_p50": _pct(times["ttfb"], 50), "ttfl_p50": _pct(times["ttfl"], 50),
        "ttfl_p99": _pct(times["ttfl"], 99), "total_p50": _pct(times["total"], 50),
        "mock_cpu_s": round(mock_cpu, 3), "client_cpu_s": round(client_cpu, 3),
        "wall_s": round(wall, 3),
    }


def interleaved(scenario: str, targets: tuple[str, ...], transports: list[str], rounds: int,
                count: int, warm: int, measure: Callable[[str, str, int], dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[str]]:
    """``measure(target, transport, count)`` for each transport, round and target, each
    target first in turn, after ``warm`` requests of each (first pool entries, lazy
    imports, a translator's first use); the runs and what was not delivered whole."""
    for tr in transports:
        for tg in targets:
            measure(tg, tr, warm)
    runs: list[dict[str, Any]] = []
    width = max(map(len, targets))
    for tr in transports:
        for rnd in range(rounds):
            turn = rnd % len(targets)
            for tg in targets[turn:] + targets[:turn]:
                r = measure(tg, tr, count)
                runs.append({"scenario": scenario, "transport": tr, "round": rnd, "target": tg,
                             **r})
                print(f"{scenario} {tr:4} round {rnd + 1} {tg:{width}}: "
                      f"{r['completed']}/{r['started']} ok, TTFL p50 {r['ttfl_p50']} ms, "
                      f"proxy CPU {r['proxy_cpu_s']} s ({r['cpu_ms_per_stream']} ms/stream), "
                      f"{r['wall_s']} s", file=sys.stderr)
    problems = [f"{scenario} {r['transport']} {r['target']} round {r['round'] + 1}: "
                f"{r['completed']}/{r['count']} complete {r['errors']}"
                for r in runs if r["completed"] != r["count"] or r["errors"]]
    return runs, problems


def run_s11(env: dict[str, Any], transports: list[str], rounds: int,
            smoke: bool) -> dict[str, Any]:
    """Every measurement of S11, interleaved per round; returns the JSON section."""
    count, chunks = (SMOKE_COUNT if smoke else SHAPE["count"]), SHAPE["chunks"]
    runs, problems = interleaved(
        "S11", TARGETS, transports, rounds, count, 5 if smoke else WARM_UP,
        lambda tg, tr, n: measure_one(env, tg, tr, n, chunks))
    for tr in transports:
        for rnd in range(rounds):
            sse = {r["target"]: set(r["digests"]) for r in runs
                   if (r["transport"], r["round"]) == (tr, rnd) and r["target"] != "ollama"}
            if len(sse.get("direct", ())) != 1 or sse.get("v1") != sse["direct"]:
                problems.append(f"S11 {tr} round {rnd + 1}: v1's SSE bodies differ from "
                                f"direct's ({sse})")
    return {"shape": {**SHAPE, "count": count}, "targets": list(TARGETS),
            "summary": summarise(runs, transports), "problems": problems, "runs": runs}


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 4) if vals else None


def _ratio(x: Any, y: Any) -> float | None:
    return round(x / y, 3) if x is not None and y else None


def _minus(x: Any, y: Any) -> float | None:
    return round(x - y, 4) if x is not None and y is not None else None


def summarise(runs: list[dict[str, Any]], transports: list[str]) -> dict[str, Any]:
    """Per transport: medians over rounds per target, ollama against v1 (ratio of CPU,
    difference of TTFL) of the medians and paired per round, and the judgement."""
    out: dict[str, Any] = {}
    for tr in transports:
        by = {(r["round"], r["target"]): r for r in runs if r["transport"] == tr}
        rounds = sorted({k for k, _ in by})
        med = {tg: {key: _median([by[(k, tg)][key] for k in rounds if (k, tg) in by])
                    for key in ("cpu_ms_per_stream", "ttfl_p50", "ttfl_p99", "ttfb_p50",
                                "total_p50", "proxy_cpu_s", "mock_cpu_s", "client_cpu_s",
                                "wall_s")}
               for tg in TARGETS}
        pairs = [(by[(k, "ollama")], by[(k, "v1")], by.get((k, "direct"))) for k in rounds
                 if (k, "ollama") in by and (k, "v1") in by]
        cpu_ratio = _median([_ratio(o["cpu_ms_per_stream"], v["cpu_ms_per_stream"])
                             for o, v, _ in pairs])
        ttfl_added = _median([_minus(o["ttfl_p50"], v["ttfl_p50"]) for o, v, _ in pairs])
        entry = {
            "median": med, "rounds": len(pairs),
            "cpu_ratio": cpu_ratio,
            "cpu_ratio_of_medians": _ratio(med["ollama"]["cpu_ms_per_stream"],
                                           med["v1"]["cpu_ms_per_stream"]),
            "ttfl_added_ms": ttfl_added,
            "ttfl_added_of_medians_ms": _minus(med["ollama"]["ttfl_p50"],
                                               med["v1"]["ttfl_p50"]),
            "ttfl_vs_direct_ms": {tg: _median([_minus(by[(k, tg)]["ttfl_p50"],
                                                      by[(k, "direct")]["ttfl_p50"])
                                               for k in rounds
                                               if (k, tg) in by and (k, "direct") in by])
                                  for tg in ("v1", "ollama")},
            "complete": all(r["completed"] == r["count"] and not r["errors"]
                            for r in by.values()),
        }
        entry["met"] = {"cpu": cpu_ratio is not None and cpu_ratio <= CPU_MAX_RATIO,
                        "ttfl": ttfl_added is not None and ttfl_added <= TTFL_MAX_ADDED_MS}
        out[tr] = entry
    return out


def table(s11: dict[str, Any], smoke: bool) -> str:
    """S11's Markdown table: medians per transport, ollama against v1."""
    base = _base()
    fmt = base.fmt
    head = ["S11", "Transport", "CPU/stream v1", "CPU/stream ollama",
            "ollama / v1 (paired; of medians)", "TTFL p50 direct", "TTFL p50 v1",
            "TTFL p50 ollama", "ollama - v1 (paired; of medians)", "Delivered",
            "Issue target", "Met"]
    rows = []
    for tr, e in s11["summary"].items():
        m = e["median"]
        met = "—"
        if not smoke:
            missed = [name for name, ok in e["met"].items() if not ok]
            met = "met" if not missed and e["complete"] else \
                "not met: " + ", ".join(missed or ["delivery"])
        rows.append([
            f"S11 (x{e['rounds']})", tr, f"{fmt(m['v1']['cpu_ms_per_stream'])} ms",
            f"{fmt(m['ollama']['cpu_ms_per_stream'])} ms",
            f"x{fmt(e['cpu_ratio'])}; x{fmt(e['cpu_ratio_of_medians'])}",
            f"{fmt(m['direct']['ttfl_p50'])} ms", f"{fmt(m['v1']['ttfl_p50'])} ms",
            f"{fmt(m['ollama']['ttfl_p50'])} ms",
            f"{fmt(e['ttfl_added_ms'], sign='+')}; "
            f"{fmt(e['ttfl_added_of_medians_ms'], sign='+')} ms",
            "all" if e["complete"] else "INCOMPLETE", TARGET_TEXT, met])
    return str(base.markdown(head, rows))
