"""``lmcache server`` start-up: bad input is one error line, exit 1, and no /dev/shm leak.

Each case runs a real ``lmcache server`` subprocess.  Segments the server makes carry its
pid (``lmcache_mp_<pid>_...``), so "no leak" is checked against exactly that process and
other processes on the machine cannot disturb the check.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lmcache.cli.commands.server import resolve_config
from lmcache.cli.main import build_parser

SHM_DIR = Path("/dev/shm")
SMALL = ["--l1-size-gb", "0.01", "--http-port", "0", "--prometheus-port", "0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _segments_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir(SHM_DIR) if f"_{pid}_" in n)


def _run_server(
    args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``lmcache server ARGS`` to its end; return it and the segments it left."""
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    base_env["LMCACHE_LOG_LEVEL"] = "WARNING"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmcache.cli.main", "server", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**base_env, **(env or {})},
        cwd=cwd,
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    leaked = _segments_of(proc.pid)
    for name in leaked:  # keep the machine clean even when the test fails
        (SHM_DIR / name).unlink(missing_ok=True)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), leaked


def _assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, "no error printed"
    last = lines[-1]
    assert last.startswith("lmcache server: error: "), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in last, last


BAD_FLAGS = {
    "port-too-big": (["--port", "99999"], "--port"),
    "port-negative": (["--port", "-5"], "--port"),
    "port-zero": (["--port", "0"], "--port"),
    "port-not-a-number": (["--port", "abc"], "--port"),
    "chunk-size-zero": (["--chunk-size", "0"], "--chunk-size"),
    "l1-negative": (["--l1-size-gb", "-1"], "--l1-size-gb"),
    "l1-zero": (["--l1-size-gb", "0"], "--l1-size-gb"),
    "http-port-too-big": (["--http-port", "99999"], "--http-port"),
    "prometheus-port-too-big": (["--prometheus-port", "70000"], "--prometheus-port"),
    "max-workers-zero": (["--max-workers", "0"], "--max-workers"),
    "max-cpu-workers-negative": (["--max-cpu-workers", "-2"], "--max-cpu-workers"),
    "log-level-verbose": (["--log-level", "verbose"], "DEBUG, INFO, WARNING"),
    "eviction-policy": (["--eviction-policy", "random"], "--eviction-policy"),
    "l2-adapter-type": (["--l2-adapter", '{"type": "nope"}'], "--l2-adapter"),
    "l2-adapter-needs-a-service": (["--l2-adapter", '{"type": "s3"}'], "needs an S3"),
    "l2-adapter-mock-fields": (
        ["--l2-adapter", '{"type": "mock", "max_size_gb": 1}'],
        "mock_bandwidth_gb",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_flag_is_one_line_error_without_leak(case: str) -> None:
    flags, needle = BAD_FLAGS[case]
    result, leaked = _run_server([*SMALL, *flags])
    _assert_one_line_error(result, needle)
    assert leaked == []


@pytest.mark.parametrize("shm", [[], ["--shm-name", ""]])
def test_l1_larger_than_shm_or_memory_fails_before_allocating(shm: list[str]) -> None:
    """Touching more pages than /dev/shm (or memory) holds ends in SIGBUS or the OOM
    killer; the size is refused before the segment exists."""
    flags = ["--http-port", "0", "--prometheus-port", "0", "--l1-size-gb", "100000", *shm]
    result, leaked = _run_server(flags)
    _assert_one_line_error(result, "--l1-size-gb 100000 does not fit")
    assert leaked == []


def test_disk_path_that_is_a_file(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    result, leaked = _run_server([*SMALL, "--l2-disk-path", str(a_file), "--l2-disk-size-gb", "1"])
    _assert_one_line_error(result, "--l2-disk-path", "not a directory")
    assert leaked == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_disk_path_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result, leaked = _run_server([*SMALL, "--l2-disk-path", str(locked), "--l2-disk-size-gb", "1"])
    _assert_one_line_error(result, "--l2-disk-path", "not writable")
    assert leaked == []


def test_disk_tier_failing_after_l1_was_made_releases_l1(tmp_path: Path) -> None:
    """The disk tier is created after L1; its failure must still unlink L1's segment."""
    blocker = tmp_path / "blocker"
    blocker.write_text("x")  # a file where the tier wants a directory level
    adapter = f'{{"type": "disk", "path": "{blocker}/sub", "size_gb": 1}}'
    result, leaked = _run_server([*SMALL, "--l2-adapter", adapter])
    _assert_one_line_error(result)
    assert leaked == []


def test_plugin_adapter_failing_after_l1_was_made_releases_l1() -> None:
    """A plugin adapter is loaded after L1 exists; a module that does not import is a
    one-line error naming it, and L1's segment goes."""
    adapter = '{"type": "plugin", "module_path": "no_such_l2_module", "class_name": "A"}'
    result, leaked = _run_server([*SMALL, "--l2-adapter", adapter])
    _assert_one_line_error(result, "no_such_l2_module")
    assert leaked == []


def test_unknown_device_backend(tmp_path: Path) -> None:
    result, leaked = _run_server(SMALL, env={"LMCACHE_DEVICE_BACKEND": "nonexistent"})
    _assert_one_line_error(result, "LMCACHE_DEVICE_BACKEND", "nonexistent")
    assert leaked == []


def _install_tied_plugins(root: Path) -> None:
    """Two available cpu backends of the same priority, as an installed distribution.

    The priority is above every real backend (lmcache-cpu's ``cpu_native`` is 10), so the
    tie is what selection meets whichever plugin session runs this."""
    (root / "tie_plugins.py").write_text(
        textwrap.dedent(
            """
            from lmcache.v1.platform.cpu import CpuDeviceSpec

            class TieA(CpuDeviceSpec):
                backend_name = property(lambda self: "tiea")
                priority = property(lambda self: 1000)

            class TieB(CpuDeviceSpec):
                backend_name = property(lambda self: "tieb")
                priority = property(lambda self: 1000)
            """
        )
    )
    dist = root / "lmcache_tie_plugins-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lmcache-tie-plugins\n"
                                   "Version: 0.0.1\n")  # fmt: skip
    (dist / "entry_points.txt").write_text(
        "[lmcache.device_plugins]\ntiea = tie_plugins:TieA\ntieb = tie_plugins:TieB\n"
    )


def test_priority_tie_between_installed_backends(tmp_path: Path) -> None:
    _install_tied_plugins(tmp_path)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    result, leaked = _run_server(SMALL, env={"PYTHONPATH": path})
    _assert_one_line_error(result, "tiea", "tieb", "LMCACHE_DEVICE_BACKEND")
    assert leaked == []


def test_missing_config_file(tmp_path: Path) -> None:
    result, leaked = _run_server([*SMALL, "--config", str(tmp_path / "nope.yaml")])
    _assert_one_line_error(result, "--config", "nope.yaml")
    assert leaked == []


def test_malformed_config_file(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("port: [\n")
    result, leaked = _run_server([*SMALL, "--config", str(config)])
    _assert_one_line_error(result, "not valid YAML")
    assert leaked == []


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("port: abc\n", "--port"),
        ("port: 99999\n", "--port"),
        ("chunk_size: 0\n", "--chunk-size"),
        ("l1-size-gb: -1\n", "--l1-size-gb"),
        ("disable_metrics: maybe\n", "--disable-metrics"),
        ("no_such_flag: 1\n", "no_such_flag"),
    ],
)
def test_config_file_values_pass_the_flag_validators(
    tmp_path: Path, body: str, needle: str
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(body)
    result, leaked = _run_server([*SMALL, "--config", str(config)])
    _assert_one_line_error(result, needle)
    assert leaked == []


def test_unbindable_host_releases_l1() -> None:
    """Binding fails after L1 exists (192.0.2.1 is TEST-NET-1, never local)."""
    result, leaked = _run_server([*SMALL, "--host", "192.0.2.1"])
    _assert_one_line_error(result, "cannot listen")
    assert leaked == []


# -- the command line wins ------------------------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["server", *argv])


def test_explicit_flag_equal_to_its_default_beats_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        "port: 6000\nchunk_size: 512\nsupported_transfer_mode: engine_driven\n"
        "disable_metrics: true\n"
    )
    resolved = resolve_config(
        _parse("--config", str(config), "--port", "5555", "--supported-transfer-mode", "auto")
    )
    assert resolved.port == 5555  # given on the command line, although equal to the default
    assert resolved.supported_transfer_mode.value == "auto"
    assert resolved.chunk_size == 512  # not given: the file wins over the default
    assert resolved.disable_metrics is True


def test_config_file_beats_defaults_and_is_converted(tmp_path: Path) -> None:
    config = tmp_path / "server.json"
    config.write_text('{"l1-size-gb": "0.5", "eviction_policy": "fifo", "http_port": 0}')
    resolved = resolve_config(_parse("--config", str(config)))
    assert resolved.l1_size_gb == 0.5
    assert resolved.eviction_policy == "FIFO"
    assert resolved.http_port == 0


def test_no_config_file_keeps_defaults() -> None:
    resolved = resolve_config(_parse())
    assert resolved.port == 5555
    assert resolved.supported_transfer_mode.value == "auto"


def test_sigterm_while_l1_is_being_made_leaves_no_segment() -> None:
    """The kill must land during construction (proved: the server never announced itself)
    while its segment exists; retried with a larger L1 if the server was too quick."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    for l1_gb in ("1", "2", "3"):
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmcache.cli.main", "server", "--port", str(free_port()),
             "--http-port", "0", "--prometheus-port", "0", "--l1-size-gb", l1_gb],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not _segments_of(proc.pid) and proc.poll() is None:
            assert time.monotonic() < deadline, "L1 segment never appeared"
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        leaked = _segments_of(proc.pid)
        for name in leaked:
            (SHM_DIR / name).unlink(missing_ok=True)
        assert leaked == []
        if "listening on" not in out:
            # 130 from `lmcache`'s own handler; -SIGINT when the KeyboardInterrupt that the
            # SIGTERM became surfaced outside it (CPython then exits through SIGINT).  Either
            # way the interrupt path ran; anything else (e.g. -SIGTERM) means it did not.
            assert proc.returncode in (130, -signal.SIGINT), err[-2000:]
            return
    pytest.fail("the server finished starting before every SIGTERM; nothing was proved")


def test_config_file_list_and_mapping_values(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        "runtime-plugin-locations: [/opt/plugins/a.py, /opt/plugins]\n"
        "runtime-plugin-config: {team: kv, level: 3}\n"
    )
    resolved = resolve_config(_parse("--config", str(config)))
    assert resolved.runtime_plugin_config.locations == ["/opt/plugins/a.py", "/opt/plugins"]
    assert resolved.runtime_plugin_config.extra_config == {"team": "kv", "level": 3}
    config.write_text("runtime-plugin-config: [1, 2]\n")
    with pytest.raises(ValueError, match=r"--runtime-plugin-config .*expected a single value"):
        resolve_config(_parse("--config", str(config)))


@pytest.mark.parametrize(
    ("given", "policy"),
    [("arc", "ARC"), ("ISOLATEDLRU", "IsolatedLRU"), ("NoOp", "noop"), ("lfu", "LFU")],
)
def test_eviction_policy_takes_upstreams_names_in_any_case(given: str, policy: str) -> None:
    assert resolve_config(_parse("--eviction-policy", given)).eviction_policy == policy


def test_eviction_policy_from_a_config_file_is_canonical(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("eviction_policy: isolatedlru\n")
    assert resolve_config(_parse("--config", str(config))).eviction_policy == "IsolatedLRU"
