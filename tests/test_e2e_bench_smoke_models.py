"""The benchmark's model-server scenarios at smoke size (S9: a managed model's cold start and
its floor; S9CMD: a command model's; S10: the idle gateways' catalogues), apart from the
other scenarios (tests/test_e2e_bench_smoke.py) so that the two halves run side by side on
two test workers. Correctness only, never a wall-clock figure."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tests.test_e2e_bench_smoke import check_s9, check_s9cmd, check_s10, smoke
from tests.workers import demo_model


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="the benchmark needs node")
def test_bench_smoke_model_servers(tmp_path: Path) -> None:
    installed = importlib.util.find_spec("xllamacpp") is not None
    if installed:
        demo_model()  # fetched under the tests' lock, not by the benchmark beside a worker
    result = smoke(tmp_path, "S9,S9CMD,S10")
    assert result["checks"]["problems"] == []
    assert result["runs"] == []  # no load scenario asked
    if not installed:
        assert result["ondemand_skipped"]
        assert result["s9"] is result["s9cmd"] is result["s10"] is None
        return
    assert result["ondemand_skipped"] is None
    check_s9(result)
    check_s9cmd(result)
    check_s10(result)
