"""The real coding agents through sluice (issue 41, SPEC §17.1): Claude Code and Codex, pinned
versions installed from npm into the gitignored ``.cache/agents`` (skipped, saying why, when
npm or the registry cannot be reached), each run once against the demo model served natively
(llama.cpp's own ``/v1/messages`` and ``/v1/responses``) and once with ``apis: translate``
(llama.cpp's chat endpoint behind the translation). Each must exit 0 with the model's text,
and the request log must show its requests, translated or not as configured.

The agents are kept small enough for a 135M model: Claude Code with its own short system
prompt and no tools (``--system-prompt``, ``--tools ""``), Codex with short instructions of
its own (its ``model_instructions_file`` setting: its built-in ones are some 4,500 tokens, a
35 s prefill for the demo model on one core here, against 4 s) and its usual tools; the
model gets a context that holds them, on one thread (one core per test worker).

Neither agent sends a temperature, so the server's default sampling decides, and at
llama.cpp's 0.8 the demo model sometimes rambled to the answer's bound (a 5-minute test in
one suite run of five). The demo model is therefore served by the bundled engine's launcher
as a command (SPEC §11.1) with ``--temp 0``: the likeliest token each time, one short
answer for one prompt, run after run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.aliases import AliasTable
from protocol.config import ModelConfig
from protocol.translate import TRANSLATORS
from proxy.demo import DEMO_MODEL
from tests.client import request
from tests.conftest import RunningGateway
from tests.test_e2e_llama import gguf, managed_gateway  # noqa: F401 (fixture)
from tests.workers import CACHE

pytest.importorskip("xllamacpp")

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.197"
CODEX = "@openai/codex@0.171.0"
AGENTS = CACHE / "agents"
RUN_TIMEOUT = 600  # seconds an agent may take: a long prompt on a slow shared CPU
PROMPT = "Reply with one word: the colour of the sea."
# The answer's bound, should greedy decoding ever loop (Codex sends no max_output_tokens
# and has no setting for it, so its context is its bound).
MAX_OUTPUT = 1024
CLAUDE_CONTEXT = 4096  # its prompt here is ~100 tokens
CODEX_CONTEXT = 2048  # its prompt with its tools ~800; an answer ends at the context's end


@pytest.fixture(scope="session")
def agents() -> Path:
    """The pinned CLIs' bin folder, installed once (npm ci-like: exact versions)."""
    bin_dir = AGENTS / "node_modules" / ".bin"
    if (bin_dir / "claude").exists() and (bin_dir / "codex").exists():
        return bin_dir
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("AGENTS TIER SKIPPED: npm is not installed, so Claude Code and Codex "
                    "cannot be installed")
    AGENTS.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                               str(AGENTS), CLAUDE_CODE, CODEX], capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.skip("AGENTS TIER SKIPPED: npm install did not finish in 600 s (registry "
                    "unreachable?)")
    if done.returncode != 0:
        pytest.skip(f"AGENTS TIER SKIPPED: npm install failed (registry unreachable?): "
                    f"{done.stderr.strip()[-400:]}")
    return bin_dir


async def start(nursery: trio.Nursery, folder: Path, model: Path, apis: str,
                context: int) -> RunningGateway:
    # One slot with room for an agent's prompt, greedy sampling (the module's docstring);
    # every name the agents send (claude-*, Codex's) served by the demo model.
    launcher = (sys.executable, "-m", "proxy.models.launcher", "--model", "${MODEL}",
                "--alias", "${NAME}", "--listen", "127.0.0.1:${PORT}", "--context",
                str(context), "--parallel", "1", "--threads", "1", "--temp", "0")
    return await managed_gateway(
        nursery, folder, ModelConfig(name=DEMO_MODEL, path=str(model), command=launcher,
                                     preload=True, apis=apis),
        aliases=AliasTable([("claude-*", DEMO_MODEL), ("gpt-*", DEMO_MODEL)]))


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A child's environment: a home of its own (no user settings, no login), no proxies."""
    home.mkdir(parents=True, exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    return {**keep, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "NO_PROXY": "127.0.0.1,localhost", **extra}


async def run_agent(argv: list[str], env: dict[str, str],
                    cwd: Path) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(RUN_TIMEOUT + 30):
        return await trio.run_process(argv, env=env, cwd=cwd, capture_stdout=True,
                                      capture_stderr=True, check=False,
                                      stdin=subprocess.DEVNULL)


async def requests_to(gw: RunningGateway, path: str) -> list[dict[str, Any]]:
    reply = await request(gw.unix, "GET", "/api/v1/requests?limit=1000")
    return [e for e in reply.json()["requests"] if e["path"] == path]


async def said(proc: subprocess.CompletedProcess[bytes], gw: RunningGateway) -> str:
    """What went wrong: the agent's output and what the gateway saw of it."""
    log = (await request(gw.unix, "GET", "/api/v1/requests?limit=20")).json()["requests"]
    seen = [(e["path"], e["status"], e["translated"], e["durationMs"], e["usage"], e["error"])
            for e in log]
    return (f"exit {proc.returncode}\nstdout: {proc.stdout.decode(errors='replace')[-2000:]}"
            f"\nstderr: {proc.stderr.decode(errors='replace')[-2000:]}\nrequests: {seen}")


@pytest.mark.parametrize("apis", ["native", "translate"])
async def test_claude_code(nursery: trio.Nursery, short_tmp: Path, gguf: Path,  # noqa: F811
                           agents: Path, apis: str) -> None:
    gw = await start(nursery, short_tmp / "g", gguf, apis, CLAUDE_CONTEXT)
    env = clean_env(short_tmp / "home", ANTHROPIC_BASE_URL=f"http://{gw.tcp}",
                    ANTHROPIC_API_KEY="sk-unused", ANTHROPIC_MODEL=DEMO_MODEL,
                    ANTHROPIC_SMALL_FAST_MODEL=DEMO_MODEL,
                    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1",
                    DISABLE_TELEMETRY="1", CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(MAX_OUTPUT),
                    API_TIMEOUT_MS=str(RUN_TIMEOUT * 1000))
    proc = await run_agent([str(agents / "claude"), "-p", PROMPT, "--model", DEMO_MODEL,
                            "--system-prompt", "You are a brief assistant.", "--tools", "",
                            "--max-turns", "1"], env, short_tmp)
    assert proc.returncode == 0, await said(proc, gw)
    assert proc.stdout.decode().strip(), await said(proc, gw)
    asked = [e for e in await requests_to(gw, "/v1/messages") if e["status"] == 200]
    assert asked, "Claude Code's request is not in the request log"
    want = "messages" if apis == "translate" else None
    assert {e["translated"] for e in asked} == {want}


@pytest.mark.parametrize("apis", ["native", "translate"])
async def test_codex(nursery: trio.Nursery, short_tmp: Path, gguf: Path,  # noqa: F811
                     agents: Path, apis: str) -> None:
    if apis == "translate" and "/v1/responses" not in TRANSLATORS:
        pytest.skip("the Responses translator is not wired on this branch yet")
    gw = await start(nursery, short_tmp / "g", gguf, apis, CODEX_CONTEXT)
    home = short_tmp / "home"
    provider = (f'model_providers.sluice={{name="sluice", base_url="http://{gw.tcp}/v1", '
                f'wire_api="responses"}}')
    env = clean_env(home, CODEX_HOME=str(home / ".codex"))
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    instructions = home / "instructions.md"
    instructions.write_text("You are a brief assistant. Answer in plain text.\n")
    proc = await run_agent([str(agents / "codex"), "exec", "--skip-git-repo-check",
                            "-c", "model_provider=sluice", "-c", provider,
                            "-c", f"model_instructions_file={str(instructions)!r}",
                            "-m", DEMO_MODEL, PROMPT], env, short_tmp)
    assert proc.returncode == 0, await said(proc, gw)
    assert proc.stdout.decode().strip(), await said(proc, gw)
    asked = [e for e in await requests_to(gw, "/v1/responses") if e["status"] == 200]
    assert asked, "Codex's request is not in the request log"
    # the usage as the server said it: Responses' (native), or the chat answer's (translated)
    key = "prompt_tokens" if apis == "translate" else "input_tokens"
    prompts = [(e.get("usage") or {}).get(key) for e in asked]
    assert all(isinstance(n, int) and n < 2500 for n in prompts), \
        f"Codex did not take the short instructions (prompt tokens {prompts})"
    want = "responses" if apis == "translate" else None
    assert {e["translated"] for e in asked} == {want}
