"""``sluice ps``'s table (proxy/cli/models.py): the UNTIL column for every case, sizes
measured or estimated, failures and the budget line, names from the API made printable."""

from __future__ import annotations

import datetime

from proxy.cli.models import show_models, until

NOW = datetime.datetime(2026, 12, 2, 12, 0, 0, tzinfo=datetime.UTC)
MIB = 1 << 20


def model(name: str, state: str, **fields: object) -> dict[str, object]:
    return {"name": name, "state": state, "keepAlive": 300.0, "unloadsAt": None,
            "activeRequests": 0, "estimatedBytes": 140 * MIB, "memoryBytes": 0,
            "lastError": None, **fields}


def test_until() -> None:
    assert until(model("a", "unloaded"), NOW) == "-"
    assert until(model("a", "loading"), NOW) == "-"
    assert until(model("a", "loaded", unloadsAt="2026-12-02T12:04:59.900Z"), NOW) == \
        "4 minutes from now"
    assert until(model("a", "loaded", unloadsAt="2026-12-02T12:00:45.000Z"), NOW) == \
        "45 seconds from now"
    assert until(model("a", "loaded", unloadsAt="2026-12-02T14:00:00.000Z"), NOW) == \
        "2 hours from now"
    assert until(model("a", "loaded", unloadsAt="2026-12-02T12:00:00.200Z"), NOW) == "now"
    assert until(model("a", "loaded", unloadsAt="2026-12-02T11:59:00.000Z"), NOW) == "now"
    assert until(model("a", "loaded", activeRequests=2), NOW) == "in use"
    assert until(model("a", "loaded", keepAlive=None), NOW) == "forever"
    assert until(model("a", "loaded", unloadsAt="not a date"), NOW) == "-"


def test_the_table() -> None:
    doc = {"models": [
        model("smollm2-135m", "loaded", memoryBytes=int(194.4 * MIB),
              unloadsAt="2026-12-02T12:04:30.000Z", waiting=7, contextLength=8192),
        model("other", "unloaded"),
        model("broken", "failed", estimatedBytes=64, lastError="broken.gguf: bad header"),
        model("evil\x1b[2J", "unloaded"),
    ], "memoryBudget": 12 << 30, "memoryInUse": int(194.4 * MIB), "maxLoaded": 2}
    lines = show_models(doc, NOW).splitlines()
    assert lines[0].split() == ["NAME", "STATE", "SIZE", "CONTEXT", "WAITING", "UNTIL"]
    assert lines[1].split() == ["smollm2-135m", "loaded", "194.4", "MiB", "8192", "7", "4",
                                "minutes", "from", "now"]  # SPEC §18: 7 requests wait
    assert lines[2].split() == ["other", "unloaded", "~140.0", "MiB", "-", "-", "-"]
    assert lines[3].split() == ["broken", "failed", "~64", "B", "-", "-", "-"]
    assert lines[4].startswith("evil?[2J ")  # no terminal control characters
    assert "broken: broken.gguf: bad header" in lines
    assert lines[-1] == "memory: 194.4 MiB in use of a 12.0 GiB budget; at most 2 loaded"
    state_at = lines[0].index("STATE")  # the columns line up
    assert [line[state_at:].split()[0] for line in lines[1:5]] == [
        "loaded", "unloaded", "failed", "unloaded"]
    assert all(line[state_at - 1] == " " for line in lines[1:5])


def test_no_models() -> None:
    text = show_models({"models": [], "memoryBudget": 1 << 30, "memoryInUse": 0,
                        "maxLoaded": 0}, NOW)
    assert text.splitlines() == [
        "no managed models (add *.gguf files to a folder of model_loading.dirs, or models: "
        "entries)", "memory: 0 B in use of a 1.0 GiB budget"]
