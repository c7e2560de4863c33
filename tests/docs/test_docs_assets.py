"""Docs that are code: generated references are current, the Kubernetes example and the
Grafana dashboard are well-formed and use only metrics the server exports."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import yaml

from lmcache.v1.multiprocess.server.metrics import ServerMetrics

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
    assert [d["kind"] for d in documents] == ["Deployment", "Service", "NetworkPolicy", "Pod"]
    for document in documents:
        jsonschema.validate(document, schema)
    server = documents[0]["spec"]["template"]["spec"]["containers"][0]
    for probe in ("livenessProbe", "readinessProbe"):
        assert server[probe]["httpGet"]["path"] == "/healthcheck"
    named = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert f"--http-port={named['http']}" in server["args"]
    assert f"--prometheus-port={named['metrics']}" in server["args"]
    assert {p["targetPort"] for p in documents[1]["spec"]["ports"]} <= set(named)
    vllm_args = documents[3]["spec"]["containers"][0]["args"]
    config = json.loads(vllm_args[vllm_args.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "LMCacheMPConnector"
    extra = config["kv_connector_extra_config"]
    assert extra["lmcache.mp.port"] == named["zmq"]
    assert extra["lmcache.mp.host"] == f"tcp://{documents[1]['metadata']['name']}"


def _k8s_documents() -> list[dict[str, Any]]:
    text = (DOCS / "k8s" / "lmcache-server.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def test_kubernetes_example_server_args_parse_and_admin_token_comes_from_a_secret() -> None:
    from lmcache.v1.multiprocess.server_config import add_mp_server_args, config_from_args

    deployment = _k8s_documents()[0]
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    parser = argparse.ArgumentParser()
    add_mp_server_args(parser)
    config = config_from_args(parser.parse_args(server["args"]))  # every flag exists
    assert config.enable_admin_ops
    assert config.admin_token is None, "a literal token in the manifest"
    assert not any(
        e["name"] == "LMCACHE_ADMIN_TOKEN" and "value" in e for e in server.get("env", [])
    )
    assert config.admin_token_file
    token_dir = str(PurePosixPath(config.admin_token_file).parent)
    (mount,) = [m for m in server["volumeMounts"] if m["mountPath"] == token_dir]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"]


def test_kubernetes_network_policy_admits_only_clients_and_prometheus() -> None:
    deployment, service, policy, vllm = _k8s_documents()
    template = deployment["spec"]["template"]
    server = template["spec"]["containers"][0]
    named = {p["name"] for p in server["ports"]}
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= template["metadata"]["labels"].items()
    assert "Ingress" in policy["spec"]["policyTypes"]
    opened: dict[str, list[dict[str, Any]]] = {}
    for rule in policy["spec"]["ingress"]:
        assert rule["from"], "a rule without 'from' admits every pod"
        for port in rule["ports"]:
            assert port["port"] in named, f"the policy opens {port['port']!r}, not a server port"
            opened.setdefault(port["port"], []).extend(rule["from"])
    # The ZMQ port (store/read any chunk) only to the vLLM pod's client label.
    (zmq_peer,) = opened["zmq"]
    assert set(zmq_peer) == {"podSelector"}
    assert zmq_peer["podSelector"]["matchLabels"].items() <= vllm["metadata"]["labels"].items()
    # HTTP (/status, POST /cache/clear) is left to the node (probes) and port-forward.
    assert "http" not in opened
    assert set(opened) <= {p["targetPort"] for p in service["spec"]["ports"]}


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
