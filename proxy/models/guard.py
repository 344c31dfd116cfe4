"""What stands between the gateway and a user's model server (SPEC §11.1), so the server never
outlives the gateway, even one killed with SIGKILL: the user's program cannot be asked to
watch its parent, so this does it for it.

Run as ``python -I -S guard.py SIGNAL PROGRAM ARG...`` (stdlib only, by path: the command's
environment is not ours to trust) in the session the gateway made for the command, with the
read end of a pipe as stdin whose write end only the gateway holds (the lifeline). It forks
a watcher, then execs the program in its own place, so the process the gateway started,
waits for and signals is the command's own (its pid is the entry's pid). The watcher keeps
the lifeline and nothing else: when the lifeline reads EOF, the gateway is gone, and the
watcher stops the command the way the gateway would (SIGNAL, SIGKILL after STOP_TIMEOUT)
and then kills whatever is left of the group, itself included. Once the command is gone (the
watcher has another parent), it leaves. Portable to macOS: fork, select, killpg."""

from __future__ import annotations

import os
import select
import signal
import sys
import time

STOP_TIMEOUT = 10.0  # the grace of proxy.models.process.STOP_TIMEOUT
LOOK_EVERY = 1.0  # seconds between two looks at whether the command is still our parent
POLL = 0.02  # seconds between two looks at whether a stopped command is gone


def watch(command: int, sig: int) -> None:
    """The watcher (fd 0 the lifeline): returns when the command is gone by itself; stops
    it when the gateway is gone."""
    while os.getppid() == command:
        ready, _, _ = select.select([0], [], [], LOOK_EVERY)
        if ready and not os.read(0, 4096):  # the gateway's end closed: it is gone
            break
    else:
        return
    try:
        if os.getppid() == command:  # else gone meanwhile: its pid may be another's soon
            os.kill(command, sig)
        for _ in range(int(STOP_TIMEOUT / POLL)):  # the grace, at least (no clock needed)
            if os.getppid() != command:
                break
            time.sleep(POLL)
    finally:
        os.killpg(0, signal.SIGKILL)  # the command if still there, its workers, us


def main(argv: list[str]) -> None:
    sig, program, args = signal.Signals[argv[0]], argv[1], argv[1:]
    command = os.getpid()
    if os.fork() == 0:
        quiet = os.open(os.devnull, os.O_RDWR)
        os.dup2(quiet, 1)  # the command's log closes when the command's output does
        os.dup2(quiet, 2)
        os.close(quiet)
        try:
            watch(command, sig)
        finally:
            os._exit(0)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)  # the lifeline is the watcher's alone
    os.close(nothing)
    try:
        os.execv(program, args)
    except OSError as exc:
        print(f"cannot run {program!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
