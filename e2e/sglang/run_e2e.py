"""SGLang ``--enable-lmcache`` against a real ``lmcache server``, end to end on CPU.

Run with the SGLang environment's interpreter (``e2e/sglang/install.py``); the stubs on
``PYTHONPATH`` are set for the SGLang processes by this script.  The commands are the ones
of docs/sglang.md (``doc_commands``: server, cfg.yaml, SGLang launch, the ``curl``
request, the metrics pipeline) with the model, ports and prompts filled in.  Four SGLang
starts, one model load each:

1. SGLang without LMCache: the reference greedy outputs;
2. SGLang A with LMCache: stores every prompt (outputs identical to the reference), one
   prompt under tenant salt "alice";
3. A killed and started again (A2): the prompt is served from LMCache (SGLang reports
   ``cached_tokens_details.storage`` and our server's Prometheus hit counter grows), output
   identical; tenant "bob" misses alice's prompt, alice hits it;
4. a second instance B beside A2: hits a prefix only A2 stored;
5. the ``lmcache server`` is killed: A2 and B still answer every request (misses), outputs
   identical, in bounded time.

SGLang leaves ``/dev/shm/sglang_loads_*`` behind when it is killed; the files this run
created are removed at the end.  Prints one ``N passed, N failed`` line; exit 1 on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vllm"))
sys.path.insert(0, str(HERE))

import doc_commands  # noqa: E402
import tiny_model  # noqa: E402  (e2e/vllm: the seeded tiny Llama)
from e2e_common import free_port, stop_server, wait_until_serving  # noqa: E402
from install import ROOT, sglang_env  # noqa: E402

DOC = doc_commands.load()

CHUNK = 64  # the server's chunk size (docs/sglang.md's command)
SHM = Path("/dev/shm")
_SENTENCES = (
    "a cache stores key value tensors so that a prefix is computed only once "
    "the server keeps chunks of the kv cache in host memory and returns them on a hit"
)
_WORDS = _SENTENCES.split(" ")


def prompt(seed: int, words: int = 200) -> str:
    """A prompt of tokenizer words (several chunks), different for every seed."""
    rotated = _WORDS[seed % len(_WORDS) :] + _WORDS[: seed % len(_WORDS)]
    return " ".join((rotated * (words // len(rotated) + 1))[:words])


P_STORE, P_TENANT, P_SHARED, P_OUTAGE = prompt(0), prompt(3), prompt(7), prompt(11)
PROMPTS = [P_STORE, P_TENANT, P_SHARED, P_OUTAGE]


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)


class SGLang:
    """One ``python -m sglang.launch_server`` (its own process group)."""

    def __init__(self, model: Path, workdir: Path, name: str, lmcache_cfg: Path | None) -> None:
        self.port = free_port()
        self.log = workdir / f"sglang-{name}.log"
        argv = doc_commands.with_option(DOC.sglang, "--model-path", str(model))
        argv = doc_commands.with_option(argv, "--port", str(self.port))
        if lmcache_cfg is None:  # the baseline: the same command without LMCache
            argv = doc_commands.with_option(argv, "--lmcache-config-file", None)
            argv = doc_commands.without_flag(argv, "--enable-lmcache")
        else:
            argv = doc_commands.with_option(argv, "--lmcache-config-file", str(lmcache_cfg))
        # Test-only: local address, no warm-up request, a fixed seed.
        argv += ["--host", "127.0.0.1", "--skip-server-warmup", "--random-seed", "0"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT,
                env=doc_env(), start_new_session=True,
            )  # fmt: skip
        self._wait_ready()

    def _wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang exited early; see {self.log}\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        self.kill()
        raise RuntimeError(f"SGLang did not come up in {timeout:.0f} s; see {self.log}")

    def generate(self, text: str, salt: str | None = None) -> dict[str, Any]:
        """The doc's request body (its prompt replaced) over HTTP."""
        body = dict(DOC_BODY, text=text)
        if salt is not None:
            body["cache_salt"] = salt
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            answer: dict[str, Any] = json.load(reply)
        return answer

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _doc_body() -> dict[str, Any]:
    data = shlex.split(DOC.generate)
    body: dict[str, Any] = json.loads(data[data.index("-d") + 1])
    return body


DOC_BODY = _doc_body()


def doc_env() -> dict[str, str]:
    """The environment of the doc's SGLang command, its relative paths made absolute."""
    env = sglang_env()
    for name, value in DOC.sglang_env.items():
        if name == "PYTHONPATH":
            env[name] = os.pathsep.join(
                [*(str(ROOT / p) for p in value.split(os.pathsep)), env[name]]
            )
        else:
            env[name] = value
    return env


def doc_curl_generate(port: int, text: str) -> dict[str, Any]:
    """The doc's ``curl`` request itself (port and prompt filled in)."""
    command = DOC.generate.replace("localhost:30000", f"127.0.0.1:{port}").replace("PROMPT", text)
    out = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    answer: dict[str, Any] = json.loads(out)
    return answer


def doc_metric_hit_tokens(http_port: int) -> float:
    """The doc's metrics pipeline; the ``result="hit"`` sample it prints."""
    command = DOC.metrics.replace("localhost:8080", f"127.0.0.1:{http_port}")
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r'^lmcache_mp_lookup_tokens_total\{result="hit"\} (\S+)$', out, re.M)
    return float(match.group(1)) if match else 0.0


def start_doc_server(port: int, http_port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """The doc's ``lmcache server`` command on free ports; returns once it answers."""
    argv = doc_commands.with_option(DOC.server, "--port", str(port))
    argv = doc_commands.with_option(argv, "--http-port", str(http_port))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmcache.cli.main", *argv, "--host", "127.0.0.1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return wait_until_serving(proc, port, log_path)


def doc_config(port: int) -> str:
    """The doc's cfg.yaml on ``port``, with a 1 s heartbeat (a killed server is noticed
    at once)."""
    text = re.sub(r"^mp_port: .*$", f"mp_port: {port}", DOC.config_yaml, flags=re.M)
    return text + "extra_config:\n  lmcache.mp.heartbeat_interval: 1\n"


def storage_hit(answer: dict[str, Any]) -> int:
    """Tokens SGLang reports as loaded from its storage backend (LMCache)."""
    details = answer.get("meta_info", {}).get("cached_tokens_details") or {}
    return int(details.get("storage", 0) or 0)


@contextmanager
def shm_cleanup() -> Iterator[None]:
    """Remove the ``/dev/shm/sglang_loads_*`` files SGLang processes of this run leave."""
    before = set(SHM.glob("sglang_loads_*"))
    try:
        yield
    finally:
        for path in set(SHM.glob("sglang_loads_*")) - before:
            path.unlink(missing_ok=True)


def run(workdir: Path, checks: Checks) -> None:
    model = tiny_model.build(workdir / "tiny-llama")
    started = time.monotonic()

    def log(what: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {what}", flush=True)

    baseline = SGLang(model, workdir, "baseline", None)
    try:
        reference = {p: baseline.generate(p)["text"] for p in PROMPTS}
    finally:
        baseline.kill()
    log("reference outputs from SGLang without LMCache")

    port, http_port = free_port(), free_port()
    server = start_doc_server(port, http_port, workdir / "lmcache-server.log")
    cfg = workdir / "cfg.yaml"
    cfg.write_text(doc_config(port))
    instances: list[SGLang] = []
    try:
        a = SGLang(model, workdir, "a", cfg)
        instances.append(a)
        first = doc_curl_generate(a.port, P_STORE)
        checks.check(first["text"] == reference[P_STORE], "A: output identical to no LMCache")
        checks.check(storage_hit(first) == 0, "A: first request is a miss")
        a.generate(P_TENANT, salt="alice")
        a.kill()
        log("A stored two prompts and was killed")

        hits_before = doc_metric_hit_tokens(http_port)
        a2 = SGLang(model, workdir, "a2", cfg)
        instances.append(a2)
        again = a2.generate(P_STORE)
        checks.check(
            storage_hit(again) >= CHUNK, f"A2 (restart): {storage_hit(again)} tokens from LMCache"
        )
        checks.check(again["text"] == reference[P_STORE], "A2: output of the hit identical")
        hits_after = doc_metric_hit_tokens(http_port)
        checks.check(
            hits_after > hits_before,
            f"server metrics count the hit ({hits_before:g} -> {hits_after:g} tokens)",
        )
        bob = a2.generate(P_TENANT, salt="bob")
        checks.check(storage_hit(bob) == 0, "tenant bob does not hit alice's prefix")
        checks.check(bob["text"] == reference[P_TENANT], "bob: output identical")
        alice = a2.generate(P_TENANT, salt="alice")
        checks.check(storage_hit(alice) >= CHUNK, "tenant alice hits her own prefix after restart")
        checks.check(alice["text"] == reference[P_TENANT], "alice: output identical")
        a2.generate(P_SHARED)
        log("A2: restart hit, tenants")

        b = SGLang(model, workdir, "b", cfg)
        instances.append(b)
        shared = b.generate(P_SHARED)
        checks.check(storage_hit(shared) >= CHUNK, "B hits the prefix A2 stored")
        checks.check(shared["text"] == reference[P_SHARED], "B: output identical")
        log("B: second instance hit")

        stop_server(server)
        for name, inst in (("A2", a2), ("B", b)):
            t0 = time.monotonic()
            answers = [inst.generate(P_OUTAGE), inst.generate(P_STORE)]
            took = time.monotonic() - t0
            same = [x["text"] for x in answers] == [reference[P_OUTAGE], reference[P_STORE]]
            checks.check(same, f"{name} with the server killed: outputs identical ({took:.1f} s)")
            checks.check(
                all(storage_hit(x) == 0 for x in answers),
                f"{name} with the server killed: misses, not errors",
            )
            checks.check(took < 90, f"{name} with the server killed answers in bounded time")
        log("server killed: misses, not errors")
    finally:
        for inst in instances:
            inst.kill()
        stop_server(server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    started = time.monotonic()
    try:
        with shm_cleanup():
            run(args.workdir, checks)
    except Exception as exc:  # a crash is a failure with its reason, not a traceback only
        checks.check(False, f"e2e run: {type(exc).__name__}: {exc}")
    print(f"sglang e2e wall time: {time.monotonic() - started:.0f} s")
    print(f"{checks.passed} passed, {len(checks.failed)} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
