"""Model servers as real child processes: the launcher without llama.cpp, a model server that
outlives the thread that started it but not its gateway. The rest: tests/test_model_processes.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def test_launcher_without_llama_cpp_says_how_to_install(short_tmp: Path) -> None:
    # Run the launcher with xllamacpp hidden from it.
    code = ("import sys; sys.modules['xllamacpp'] = None; "
            "from proxy.models.launcher import main; "
            "raise SystemExit(main(['--model', 'x.gguf', '--alias', 'm', '--listen', "
            "'127.0.0.1:0']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 3
    assert "pip install 'sluice[llama]'" in result.stderr


# A stand-in for the launcher's wait: the real parent watch, then the stop signal.
_WATCHED_CHILD = """
import signal, sys
from pathlib import Path
from proxy.models.launcher import watch_parent
out = Path(sys.argv[1])
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
watch_parent(interval=0.05)
out.write_text("ready")
signal.sigwait({signal.SIGTERM})
out.write_text("stopped")
"""


# Starts the child from a thread that ends once the child is ready, as trio's
# open_process does from a worker thread (which exits after 10 s idle), and stays up until
# killed.
_PARENT = """
import subprocess, sys, threading, time
from pathlib import Path
def spawn():
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    while not (Path(sys.argv[2]).exists() and Path(sys.argv[2]).read_text() == "ready"):
        time.sleep(0.01)
    print(child.pid, flush=True)
starter = threading.Thread(target=spawn)
starter.start()
starter.join()
time.sleep(120)
"""


def _wait_for(path: Path, text: str, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text() == text:
            return True
        time.sleep(0.02)
    return False


def test_a_model_server_outlives_the_thread_that_started_it_not_the_gateway(
        tmp_path: Path) -> None:
    """The launcher's parent watch: the thread that spawned it ending leaves it running
    (PR_SET_PDEATHSIG would have stopped it: the demo model died every 10 s), and the
    parent process dying stops it."""
    out = tmp_path / "child-state"
    root = str(Path(__file__).resolve().parent.parent)
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _WATCHED_CHILD, str(out)],
                              stdout=subprocess.PIPE, text=True, cwd=root,
                              env={**os.environ, "PYTHONPATH": root})
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())  # the starting thread ends after this
        time.sleep(0.5)  # one check of the watch (every 0.5 s) later
        assert out.read_text() == "ready"
        os.kill(child_pid, 0)  # still running
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
    assert _wait_for(out, "stopped")


def test_a_model_server_whose_gateway_is_already_gone_stops_at_once() -> None:
    """``--parent`` names the gateway: a launcher started after it died (its parent is
    someone else by then) exits 0 before loading anything."""
    root = str(Path(__file__).resolve().parent.parent)
    code = ("from proxy.models.launcher import watch_parent\n"
            "watch_parent(parent=1)\n"  # we were started by pytest, not by pid 1
            "print('still here')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0
    assert done.stdout == ""

