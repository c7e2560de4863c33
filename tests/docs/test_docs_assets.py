"""Docs that are code: generated references are current, the Kubernetes example and the
Grafana dashboard are well-formed and use only metrics the server exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

from lmcache.v1.multiprocess.metrics import ServerMetrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_generated_references_are_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(DOCS / "gen_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_kubernetes_example_matches_the_schema() -> None:
    schema = json.loads((Path(__file__).parent / "k8s_schema.json").read_text())
    text = (DOCS / "k8s" / "lmcache-server.yaml").read_text()
    documents = [d for d in yaml.safe_load_all(text) if d]
    assert [d["kind"] for d in documents] == ["Deployment", "Service", "Pod"]
    for document in documents:
        jsonschema.validate(document, schema)
    server = documents[0]["spec"]["template"]["spec"]["containers"][0]
    for probe in ("livenessProbe", "readinessProbe"):
        assert server[probe]["httpGet"]["path"] == "/healthcheck"
    named = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert f"--http-port={named['http']}" in server["args"]
    assert f"--prometheus-port={named['metrics']}" in server["args"]
    assert {p["targetPort"] for p in documents[1]["spec"]["ports"]} <= set(named)
    vllm_args = documents[2]["spec"]["containers"][0]["args"]
    config = json.loads(vllm_args[vllm_args.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "LMCacheMPConnector"
    extra = config["kv_connector_extra_config"]
    assert extra["lmcache.mp.port"] == named["zmq"]
    assert extra["lmcache.mp.host"] == f"tcp://{documents[1]['metadata']['name']}"


def _exported_families() -> set[str]:
    state = {
        "tiers": [
            {"name": "LocalCPUBackend", "kind": "l1", "used_bytes": 0, "capacity_bytes": 1,
             "objects": 0, "evictions": 0},
            {"name": "LocalDiskBackend", "kind": "disk", "used_bytes": 0, "capacity_bytes": 1,
             "objects": 0, "evictions": 0},
        ],
        "workers": {"lmcache_driven": 0, "engine_driven": 0},
        "pinned_objects": 0,
        "healthy": True,
    }  # fmt: skip
    metrics = ServerMetrics(lambda: state)
    try:
        metrics.observe_request("store", "ok", 0.001)
        metrics.add_stored("engine_driven", "shm", 1)
        metrics.add_retrieved("engine_driven", "shm", 1)
        text = metrics.exposition().decode()
    finally:
        metrics.close()
    return set(re.findall(r"^(lmcache_mp_\w+)", text, re.MULTILINE))


def test_grafana_dashboard_uses_exported_metrics() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exported = _exported_families()
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"lmcache_mp_\w+", target["expr"]))
    assert used, "the dashboard queries no lmcache metric"
    assert used <= exported, f"not exported: {sorted(used - exported)}"
