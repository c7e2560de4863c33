"""Launch runtime plugins: scripts run as child processes beside an LMCache process.

This is upstream LMCache 0.5.6's ``lmcache.v1.plugin.runtime_plugin_launcher`` API
(:class:`RuntimePluginLauncher`), implemented for this package.

* Every ``runtime_plugin_locations`` entry is a script or a directory searched
  recursively for ``*.py`` and ``*.sh`` files.
* A file named ``ROLE_NAME.py`` runs only for that role (``ALL`` for every role), and
  ``ROLE_ID_NAME.py`` only on worker ``ID``; with ``role=None`` (MP mode, which has no
  roles) no file is filtered.
* The interpreter is the file's shebang if it resolves on ``PATH``, else ``python`` /
  ``python3`` for ``.py`` and ``bash`` for ``.sh``.
* A plugin gets its context in the environment: ``LMCACHE_RUNTIME_PLUGIN_ROLE``,
  ``..._CONFIG`` (the config's ``to_json()``), ``..._WORKER_COUNT`` and ``..._WORKER_ID``,
  each also under the older ``LMCACHE_PLUGIN_*`` name. Its output is logged line by
  line, and :meth:`RuntimePluginLauncher.stop_plugins` (also run at exit) terminates it.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)

_PLUGIN_SUFFIXES = ("*.py", "*.sh")
_FALLBACK_INTERPRETERS = {".py": ("python", "python3"), ".sh": ("bash",)}
# How long stopped plugins get, together, to exit on SIGTERM before they are killed.
STOP_GRACE_S = 5.0


class PluginLauncherConfig(Protocol):
    """What the launcher reads from its config (``LMCacheEngineConfig`` fits)."""

    @property
    def runtime_plugin_locations(self) -> list[str] | None: ...

    def to_json(self) -> str: ...


class RuntimePluginLauncher:
    """Starts the plugins of ``config.runtime_plugin_locations`` for one process."""

    def __init__(
        self,
        config: PluginLauncherConfig,
        role: str | None,
        worker_count: int,
        worker_id: int,
    ) -> None:
        self.config = config
        self.role = role
        self.worker_count = worker_count
        self.worker_id = worker_id
        self.plugin_processes: list[subprocess.Popen[str]] = []
        # Plugins must not outlive the process that started them.
        atexit.register(self.stop_plugins)

    def launch_plugins(self) -> None:
        """Start every plugin found under the configured locations."""
        for location in self.config.runtime_plugin_locations or []:
            for file in self._plugin_files(location):
                self._launch_plugin(file)

    @staticmethod
    def _plugin_files(location: str) -> list[Path]:
        path = Path(location)
        if not path.exists():
            logger.warning("Runtime plugin location %s does not exist", location)
            return []
        if path.is_file():
            return [path]
        return sorted(file for pattern in _PLUGIN_SUFFIXES for file in path.rglob(pattern))

    def _should_skip_plugin(self, file: Path, parts: list[str]) -> bool:
        """Whether the ``ROLE[_WORKERID]_NAME`` naming rules exclude ``file`` here.

        ``parts`` is the lower-cased file stem split on ``_``; a one-part name always runs.
        """
        if len(parts) < 2 or self.role is None:
            return False
        plugin_role = parts[0].upper()
        if plugin_role not in ("ALL", self.role.upper()):
            logger.info("Skipping %s: requires role %s", file, plugin_role)
            return True
        # The worker id is the second part only when a name part follows it.
        if len(parts) > 2 and parts[1].isdigit() and int(parts[1]) != self.worker_id:
            logger.info(
                "worker %d is skipping plugin %s, which is only for worker ID %d",
                self.worker_id,
                file,
                int(parts[1]),
            )
            return True
        return False

    def _plugin_env(self) -> dict[str, str]:
        env = os.environ.copy()
        config_json = self.config.to_json()
        values = {
            "ROLE": self.role or "",
            "CONFIG": config_json,
            "WORKER_COUNT": str(self.worker_count),
            "WORKER_ID": str(self.worker_id),
        }
        for name, value in values.items():
            env[f"LMCACHE_RUNTIME_PLUGIN_{name}"] = value
            env[f"LMCACHE_PLUGIN_{name}"] = value  # the name plugins used before
        # Python plugins flush each line, so their output is logged as it happens.
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _launch_plugin(self, file: Path) -> None:
        if self._should_skip_plugin(file, file.stem.lower().split("_")):
            return
        try:
            interpreter = self._get_interpreter(file)
            proc = subprocess.Popen(
                [interpreter, str(file)],
                env=self._plugin_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        except (OSError, ValueError) as exc:
            # One broken plugin must not stop the others or the host process.
            logger.error("Failed to launch runtime plugin %s: %s", file, exc)
            return
        self.plugin_processes.append(proc)
        logger.info("Launched runtime plugin %s with %s", file, interpreter)
        threading.Thread(
            target=self._capture_plugin_output,
            args=(proc, str(file)),
            name=f"lmcache-plugin-{file.stem}",
            daemon=True,
        ).start()

    def _get_interpreter(self, file: Path) -> str:
        """The resolved interpreter for ``file``: its shebang first, then the defaults.

        Raises ``ValueError`` for a file type other than ``.py``/``.sh`` or when nothing
        resolves.
        """
        fallbacks = _FALLBACK_INTERPRETERS.get(file.suffix)
        if fallbacks is None:
            raise ValueError(f"Runtime plugin type {file.suffix!r} is not supported ({file})")
        candidates: list[str] = []
        try:
            with open(file, encoding="utf-8") as handle:
                first_line = handle.readline().strip()
        except (OSError, UnicodeDecodeError) as exc:
            logger.warning("Cannot read the shebang of runtime plugin %s: %s", file, exc)
            first_line = ""
        if first_line.startswith("#!"):
            shebang = first_line[2:].strip()
            candidates.append(shebang)
            words = shebang.split()
            # ``#!/usr/bin/env python3`` names its interpreter in the second word.
            if len(words) >= 2 and Path(words[0]).name == "env":
                candidates.append(words[1])
        candidates.extend(fallbacks)
        for candidate in candidates:
            resolved = shutil.which(candidate)
            if resolved:
                return resolved
        raise ValueError(f"No interpreter found for runtime plugin {file} (tried {candidates})")

    @staticmethod
    def _capture_plugin_output(proc: subprocess.Popen[str], plugin_name: str) -> None:
        try:
            assert proc.stdout is not None  # started with stdout=PIPE
            for line in iter(proc.stdout.readline, ""):
                logger.info("[%s] %s", plugin_name, line.rstrip())
            proc.wait()
            logger.info("Runtime plugin %s exited with code %s", plugin_name, proc.returncode)
        except Exception as exc:  # a logging thread must never raise
            logger.error("Error reading the output of runtime plugin %s: %s", plugin_name, exc)

    def stop_plugins(self, grace_s: float = STOP_GRACE_S) -> None:
        """Terminate the plugins still running, give them ``grace_s`` seconds together to
        exit, and kill the rest (safe to call more than once)."""
        # No logging: at interpreter exit (atexit) the log handlers may be closed already.
        stopping: list[subprocess.Popen[str]] = []
        for proc in self.plugin_processes:
            try:
                if proc.poll() is None:
                    proc.terminate()
                    stopping.append(proc)
            except Exception:
                pass
        deadline = time.monotonic() + grace_s
        for proc in stopping:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # A plugin that ignores SIGTERM must not outlive its host.
                proc.kill()
                proc.wait()
            except Exception:
                pass
