"""``lmcache server --runtime-plugin-locations``: plugins start with the server, get its
configuration (secrets redacted) and stop with it, even one that ignores SIGTERM."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mp_server_helpers import ServerProcess

TOKEN = "plugin-test-admin-token-0123456789"

PLUGIN = textwrap.dedent(
    """\
    #!/usr/bin/env {python}
    import json, os, signal, sys, time
    out = sys.argv[0] + ".out"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # must still not outlive the server
    with open(out + ".tmp", "w") as f:
        json.dump({{"pid": os.getpid(),
                   "config": os.environ["LMCACHE_RUNTIME_PLUGIN_CONFIG"]}}, f)
    os.replace(out + ".tmp", out)
    print("plugin up", flush=True)
    while True:
        time.sleep(0.2)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state in /proc says it has exited.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_plugin_starts_with_the_config_and_stops_with_the_server(tmp_path: Path) -> None:
    plugin = tmp_path / "watch.py"
    plugin.write_text(PLUGIN.format(python=Path(sys.executable).name))
    report = Path(f"{plugin}.out")
    server = ServerProcess(
        [
            "--l1-size-gb", "0.05",
            "--runtime-plugin-locations", str(plugin),
            "--runtime-plugin-config", '{"team": "kv", "level": 3}',
            "--admin-token", TOKEN,
            "--l2-adapter", '{"type": "resp", "host": "127.0.0.1", "port": 1, '
            '"password": "hunter2-secret", "optional": true}',
        ],
        tmp_path / "server.log",
    )  # fmt: skip
    try:
        server.wait_ready()
        assert _wait_for(report.exists, 30), server.log()
        started = json.loads(report.read_text())
        blob = json.loads(started["config"])
        assert blob["mp"]["port"] == server.port
        assert blob["runtime_plugin_extra_config"] == {"team": "kv", "level": 3}
        raw = started["config"]
        assert TOKEN not in raw and "hunter2-secret" not in raw
        assert _alive(started["pid"])
    finally:
        server.stop()
    # The plugin ignores SIGTERM: the server kills it after the grace period.
    assert _wait_for(lambda: not _alive(started["pid"]), 15)


def test_runtime_plugin_config_must_be_a_json_object(tmp_path: Path) -> None:
    server = ServerProcess(["--runtime-plugin-config", "[1, 2]"], tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="expected a JSON object"):
        server.wait_ready(timeout=30)
    server.stop()
