"""S13 (issue 42): who goes first when a batch job fills the one slot of a real llama.cpp.

One llama.cpp server (the bundled launcher, one slot, one thread, on a Unix socket) behind
one ``sluice serve`` (its one backend, health checks every second so that its slots are
known), run twice: ``scheduling.queue: false`` (before SPEC §18: every request is sent at
once and waits inside the server) and ``true`` (the queue). Default timeouts otherwise. Each
mode starts cold (new processes) and is warmed with one tiny request.

- **Idle**: the short question alone (the idle server's time to first token), and one long
  prompt alone, each twice (the medians).
- **Burst N** (8, then 12): a batch client (``x-sluice-priority: batch``, one session) sends
  N long prompts at once; an interactive user (another session) asks the short question
  1 s later. The question's TTFT against one long prompt's + the idle server's; how many of
  all N + 1 failed.
- **Two clients**: client X sends 8 long prompts at once (interactive), client Y one 1 s
  later: how many of X's finished before Y's (with the queue: the one in progress only).

Standard library only (bench/run.py's process helpers, S12's streaming client). Its figures
are printed as a table and written to bench/results/s13.json; docs/performance.md quotes
them. ``scripts/bench --scenarios S13`` or ``.venv/bin/python bench/scheduling.py --help``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ is not a package on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import multiturn_texts as texts
from bench import run as bench
from bench.multiturn import gguf_path
from bench.multiturn_workload import stream_turn

ROOT = Path(__file__).resolve().parents[1]
HEALTH = "health_checks:\n  interval: 1s\n  timeout: 800ms\n"
READY_TIMEOUT = 90.0
QUESTION = [{"role": "user", "content": "What colour is the sky on a clear day?"}]
BATCH = {"x-sluice-priority": "batch", "x-sluice-session": "batch-job"}
USER = {"x-sluice-session": "a-person"}
CLIENT_X = {"x-sluice-session": "client-x"}
CLIENT_Y = {"x-sluice-session": "client-y"}
REQUEST_LIMIT = 900.0  # one request, start to end (12 long prompts on one slot: minutes)


def long_prompt(i: int, words: int) -> list[dict[str, str]]:
    """Prompt ``i``: ``words`` words of its own (no prefix shared with another)."""
    return [{"role": "user", "content": f"Report {i}. {texts.prose(f's13-{i}', words)} "
                                        "Summarise the report in one line."}]


class Rig:
    """One llama.cpp slot behind one gateway (see the module docstring)."""

    def __init__(self, gguf: Path, queue: bool, context: int, threads: int) -> None:
        self.kids = bench.Children()
        self.tmp = Path(tempfile.mkdtemp(prefix="sl13-", dir="/tmp"))
        sock, log = self.tmp / "llama.sock", self.tmp / "llama.log"
        llama = self.kids.start("llama", [
            sys.executable, "-m", "proxy.models.launcher", "--model", str(gguf),
            "--alias", texts.MODEL, "--listen", str(sock), "--context", str(context),
            "--parallel", "1", "--threads", str(threads)], log, stdout=bench.subprocess.PIPE,
            env=bench.tree_env())
        self.gw = bench.spawn_gateway(
            self.kids, self.tmp, "gw",
            f"backends:\n  - name: llama\n    url: unix:{sock}\n{HEALTH}"
            f"scheduling:\n  queue: {'true' if queue else 'false'}\n")
        assert llama.stdout is not None
        if not llama.stdout.readline().decode().startswith("listening "):
            raise RuntimeError(f"llama.cpp did not start:\n{bench.tail(log)}")
        self.target = {"unix": self.gw["unix"]}

        def slots() -> bool:
            return any(((m.get("sluice") or {}).get("slots") or {}).get("total") == 1
                       for m in bench.get_model_entries(self.target))

        bench.wait_until(slots, self.gw["proc"], "the gateway", "its server's one slot",
                         self.gw["log"], READY_TIMEOUT)
        ask(self.target, [{"role": "user", "content": "Hi"}], 1, {}, time.monotonic())

    def close(self) -> None:
        self.kids.stop_all()
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


def ask(target: dict[str, str], messages: list[dict[str, str]], tokens: int,
        headers: dict[str, str], t0: float) -> dict[str, Any]:
    turn = stream_turn(target, "gw", messages, tokens, t0, headers, REQUEST_LIMIT)
    turn.pop("answer", None)
    return turn


def failed(turn: dict[str, Any]) -> bool:
    return turn["status"] != 200 or not turn["done"] or turn["error"] is not None


def at_once(jobs: list[tuple[float, str, list[dict[str, str]], int, dict[str, str]]],
            target: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each job ``(delay, label, messages, tokens, headers)`` in a thread of its own, sent
    ``delay`` seconds after the start; every record by label (``finished``: its place
    among the ends)."""
    out: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(delay: float, label: str, messages: list[dict[str, str]], tokens: int,
            headers: dict[str, str]) -> None:
        time.sleep(delay)
        turn = ask(target, messages, tokens, headers, t0)
        with lock:
            turn["finished"] = len(out)
            out[label] = turn

    threads = [threading.Thread(target=one, args=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    end = t0 + REQUEST_LIMIT + 60
    for t in threads:
        t.join(max(0.1, end - time.monotonic()))
    return out


def idle(rig: Rig, words: int, tokens: int) -> dict[str, Any]:
    questions = [ask(rig.target, QUESTION, 8, USER, time.monotonic()) for _ in range(2)]
    longs = [ask(rig.target, long_prompt(900 + i, words), tokens, BATCH, time.monotonic())
             for i in range(2)]
    if any(failed(t) for t in questions + longs):
        raise RuntimeError(f"S13 idle requests failed: {questions + longs}")
    return {"question_ttft_s": statistics.median(t["ttft_s"] for t in questions),
            "long_ttft_s": statistics.median(t["ttft_s"] for t in longs),
            "long_total_s": statistics.median(t["total_s"] for t in longs)}


def burst(rig: Rig, n: int, words: int, tokens: int, base: int) -> dict[str, Any]:
    jobs: list[tuple[float, str, list[dict[str, str]], int, dict[str, str]]] = [
        (0.0, f"batch{i}", long_prompt(base + i, words), tokens, BATCH) for i in range(n)]
    jobs.append((1.0, "question", QUESTION, 8, USER))
    got = at_once(jobs, rig.target)
    question = got.get("question") or {"status": None, "done": False, "error": "missing"}
    return {"n": n, "question": question,
            "failures": sum(1 for j in jobs if j[1] not in got or failed(got[j[1]])),
            "batch_failures": sum(1 for j in jobs[:-1]
                                  if j[1] not in got or failed(got[j[1]])),
            "wall_s": max((t["end"] for t in got.values()), default=None)}


def two_clients(rig: Rig, words: int, tokens: int, base: int) -> dict[str, Any]:
    jobs: list[tuple[float, str, list[dict[str, str]], int, dict[str, str]]] = [
        (0.0, f"x{i}", long_prompt(base + i, words), tokens, CLIENT_X) for i in range(8)]
    jobs.append((1.0, "y", long_prompt(base + 8, words), tokens, CLIENT_Y))
    got = at_once(jobs, rig.target)
    y = got.get("y") or {"finished": None, "status": None, "done": False, "error": "missing"}
    return {"y": y, "x_before_y": y.get("finished"),
            "failures": sum(1 for j in jobs if j[1] not in got or failed(got[j[1]]))}


def run_mode(gguf: Path, queue: bool, opts: argparse.Namespace) -> dict[str, Any]:
    rig = Rig(gguf, queue, opts.context, opts.threads)
    try:
        print(f"S13 queue={queue}: idle", file=sys.stderr)
        out: dict[str, Any] = {"queue": queue, "idle": idle(rig, opts.words, opts.tokens)}
        out["bursts"] = []
        for n in opts.bursts:
            print(f"S13 queue={queue}: burst of {n}", file=sys.stderr)
            out["bursts"].append(burst(rig, n, opts.words, opts.tokens, 100 * n))
        print(f"S13 queue={queue}: two clients", file=sys.stderr)
        out["two_clients"] = two_clients(rig, opts.words, opts.tokens, 5000)
        return out
    finally:
        rig.close()


def _s(value: Any) -> str:
    return "—" if value is None else f"{value:.2f} s"


def table(result: dict[str, Any]) -> str:
    rows = ["| mode | burst | question TTFT | long TTFT + idle TTFT | ratio | failures "
            "(of N+1) | batch failures |", "|---|---|---|---|---|---|---|"]
    for mode in result["modes"]:
        name = "queue on (after)" if mode["queue"] else "queue off (before)"
        base = mode["idle"]["long_ttft_s"] + mode["idle"]["question_ttft_s"]
        for b in mode["bursts"]:
            ttft = b["question"].get("ttft_s")
            ratio = "—" if ttft is None or failed(b["question"]) else f"{ttft / base:.2f}x"
            shown = _s(ttft) if not failed(b["question"]) else \
                f"failed ({b['question'].get('status')})"
            rows.append(f"| {name} | {b['n']} | {shown} | {_s(base)} | {ratio} | "
                        f"{b['failures']} | {b['batch_failures']} |")
    rows += ["", "| mode | idle: question TTFT | idle: long prompt TTFT | two clients: X's "
             "answers before Y's | Y's TTFT | failures |", "|---|---|---|---|---|---|"]
    for mode in result["modes"]:
        name = "queue on (after)" if mode["queue"] else "queue off (before)"
        two = mode["two_clients"]
        rows.append(f"| {name} | {_s(mode['idle']['question_ttft_s'])} | "
                    f"{_s(mode['idle']['long_ttft_s'])} | {two['x_before_y']} of 8 | "
                    f"{_s(two['y'].get('ttft_s'))} | {two['failures']} |")
    return "\n".join(rows)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bursts", default="8,12", help="the batch's burst sizes (default 8,12)")
    ap.add_argument("--words", type=int, default=300,
                    help="words of each long prompt (default 300: about 400 tokens, 10 s or "
                         "more of prefill for one thread of a busy 2-core machine)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens each long prompt asks for")
    ap.add_argument("--context", type=int, default=2048, help="the server's context")
    ap.add_argument("--threads", type=int, default=1, help="the server's threads")
    ap.add_argument("--modes", default="off,on", help="queue off, on, or both (default)")
    ap.add_argument("--smoke", action="store_true",
                    help="a quick check of the harness: short prompts, bursts of 2 and 3")
    ap.add_argument("--json", type=Path, help="where the JSON goes (bench/results/s13.json)")
    return ap


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    if importlib.util.find_spec("xllamacpp") is None:
        print("S13 needs the llama extra (xllamacpp)", file=sys.stderr)
        return 2
    opts.bursts = [int(n) for n in str(opts.bursts).split(",") if n.strip()]
    if opts.smoke:
        opts.bursts, opts.words, opts.tokens = [2, 3], 60, 4
    gguf = gguf_path(None)
    began = time.monotonic()
    modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    result: dict[str, Any] = {"scenario": "S13", "words": opts.words, "tokens": opts.tokens,
                              "context": opts.context, "threads": opts.threads, "modes": []}
    for mode in modes:
        result["modes"].append(run_mode(gguf, mode == "on", opts))
    result["wall_s"] = round(time.monotonic() - began, 1)
    md = table(result)
    problems = []
    for mode in result["modes"]:
        if mode["queue"]:
            problems += [f"burst {b['n']}: {b['failures']} failed" for b in mode["bursts"]
                         if b["failures"]]
            if mode["two_clients"]["x_before_y"] not in (0, 1):
                problems.append(f"two clients: {mode['two_clients']['x_before_y']} of X's "
                                "before Y's")
    out = opts.json or ROOT / "bench" / "results" / ("s13-smoke.json" if opts.smoke
                                                     else "s13.json")
    return bench.write_result(out, json.loads(json.dumps(result)), md, problems, opts.smoke)


if __name__ == "__main__":
    sys.exit(main())
