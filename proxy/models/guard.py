"""What stands between the gateway and a user's model server (SPEC §11.1), so the server never
outlives the gateway, even one killed with SIGKILL: the user's program cannot be asked to
watch its parent, so a watcher does it for it.

The command is started as ``/bin/sh -c GUARD sluice-guard SIGNAL PROGRAM ARG...`` in the
session the gateway makes for it, with the read end of a pipe as stdin whose write end only
the gateway holds (the lifeline). The shell starts the watcher in the background, then execs
the program in its own place, so the process the gateway started, waits for and signals is
the command's own (its pid is the entry's pid) and only a shell's start (a millisecond or
two) comes before it. The watcher keeps the lifeline, with its output on /dev/null (the
command's log closes when the command's output does); when the lifeline reads EOF the
gateway is gone, and the watcher stops the command as the gateway would: SIGNAL, SIGKILL of
the whole group (the watcher included) once it is gone or after STOP_TIMEOUT. While the
gateway lives the watcher never wakes: the gateway kills the command's group, the watcher
with it, before it closes the lifeline (:func:`proxy.models.process.reaped`). POSIX sh, kill
and sleep only: Linux and macOS alike.
"""

from __future__ import annotations

__all__ = ["GUARD", "guarded"]

STOP_POLLS = 500  # looks at whether the stopped command is gone, POLL_SECONDS apart: its
POLL_SECONDS = "0.02"  # grace of 10 s, as proxy.models.process.STOP_TIMEOUT

# The lifeline goes to the watcher as fd 3: a background list's stdin is /dev/null (POSIX).
GUARD = f"""sig=$1
shift
command=$$
exec 3<&0
(
    exec <&3 3<&- >/dev/null 2>&1
    while read -r _; do :; done
    kill -s "$sig" "$command" || exit 0
    polls=0
    while kill -0 "$command" && [ "$polls" -lt {STOP_POLLS} ]; do
        /bin/sleep {POLL_SECONDS}
        polls=$((polls + 1))
    done
    kill -s KILL -- "-$command"
) &
exec "$@" </dev/null 3<&-
"""


def guarded(stop_signal: str, argv: list[str]) -> list[str]:
    """``argv`` (its program found) run through the guard; ``stop_signal`` as SPEC §11.1
    names it (``SIGTERM``)."""
    return ["/bin/sh", "-c", GUARD, "sluice-guard", stop_signal.removeprefix("SIG"), *argv]
