"""Deployment files agree with the code: ports, commands, settings names, probes, metric names.

No docker engine or Kubernetes cluster here, so the files are parsed and checked against the
real Settings, the real CLI and the real /metrics output of the service, and the dashboard's
other series against the names each exporter's source registers (cited where they are listed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from egrm.cli import build_parser
from egrm.config import Settings
from egrm.engines.base import EngineStats
from egrm.gpu_monitor import GpuMonitor
from egrm.main import create_app
from egrm.metrics import Metrics
from egrm.pipeline.sharing import SharingStats
from tests.test_gpu_monitor import FakeNvml

ROOT = Path(__file__).resolve().parents[1]
K8S_DIR = ROOT / "deploy" / "k8s"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "egrm.json"
SETTINGS_PORT = Settings.model_fields["port"].default
SCORER_COMMAND = ["egrm", "scorer", "--host", "0.0.0.0", "--port", "8001"]

# Settings named in deploy/ before the code has them (none today).
PENDING_SETTINGS: set[str] = set()
SETTING_NAMES = {f"EGRM_{name.upper()}" for name in Settings.model_fields}
# Names the locustfile reads (a client's settings, not the service's).
LOCUST_NAMES = set(re.findall(r'os\.environ\.get\("(EGRM_\w+)"', (ROOT / "loadtest" / "locustfile.py").read_text()))


def load_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


COMPOSE = load_yaml(ROOT / "docker-compose.yml")[0]
SERVICES: dict[str, dict] = COMPOSE["services"]
K8S = [doc for path in sorted(K8S_DIR.glob("*.yaml")) if path.name != "kustomization.yaml" for doc in load_yaml(path)]
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
GPU_SERVICES = {"sglang", "dcgm-exporter"}  # compose's gpu profile
VLLM_DIR = ROOT / "deploy" / "k8s-vllm"
POD_FOLDERS = {"/opt/egrm/served-model"}  # filled by the api pod's init container


def k8s(kind: str, name: str) -> dict:
    (doc,) = [d for d in K8S if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def workload(name: str) -> dict:
    (doc,) = [d for d in K8S if d["kind"] in WORKLOAD_KINDS and d["metadata"]["name"] == name]
    return doc


def container(workload: dict) -> dict:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` as compose resolves it with VAR unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def compose_port(service: str) -> int:
    """The port a compose service listens on: its --port flag, else EGRM_PORT, else the one port it
    exposes, else the Settings default."""
    svc = SERVICES[service]
    if "--port" in svc.get("command", []):
        return int(flag(svc["command"], "--port"))
    if "EGRM_PORT" in svc.get("environment", {}):
        return int(svc["environment"]["EGRM_PORT"])
    (port,) = svc.get("expose", [SETTINGS_PORT])
    return int(port)


# --- every file parses, every EGRM_* name is a setting -------------------------------------------


def test_every_manifest_parses_and_kustomize_lists_them_all():
    kustomization = load_yaml(K8S_DIR / "kustomization.yaml")[0]
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    assert all(doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"] for doc in K8S)
    assert {d["kind"] for d in K8S} == {"ConfigMap", "Service", "HorizontalPodAutoscaler", *WORKLOAD_KINDS}


def deploy_texts() -> Iterator[tuple[str, str]]:
    for path in [ROOT / "Dockerfile", ROOT / "docker-compose.yml", *sorted((ROOT / "deploy").rglob("*.*"))]:
        yield str(path.relative_to(ROOT)), path.read_text()


def test_every_egrm_name_in_deploy_files_is_a_setting():
    known = SETTING_NAMES | PENDING_SETTINGS | LOCUST_NAMES
    used = {(name, where) for where, text in deploy_texts() for name in re.findall(r"EGRM_[A-Z0-9_]+", text)}
    assert {(name, where) for name, where in used if name not in known} == set()
    assert LOCUST_NAMES == {"EGRM_API_KEY"}  # the extraction above found the locustfile's one name


def test_service_env_names_are_settings_and_locust_env_names_are_read_by_the_locustfile():
    for name, svc in SERVICES.items():
        env = {n for n in svc.get("environment", {}) if n.startswith("EGRM_")}
        expected = LOCUST_NAMES if name == "locust" else SETTING_NAMES | PENDING_SETTINGS
        assert env <= expected, name
    assert set(SERVICES["locust"]["environment"]) == LOCUST_NAMES


@pytest.mark.parametrize(
    "env",
    [
        {k: interpolate(v) for k, v in SERVICES["api"]["environment"].items()},
        k8s("ConfigMap", "egrm-config")["data"],
    ],
    ids=["compose-api", "k8s-configmap"],
)
def test_setting_values_in_deploy_files_are_valid(env, monkeypatch, tmp_path):
    for name, value in env.items():
        if name not in PENDING_SETTINGS:
            # A folder only the pod has (filled by its init container; see the test below) stands
            # for one that exists.
            monkeypatch.setenv(name, str(tmp_path) if value in POD_FOLDERS else value)
    settings = Settings()  # raises on any value the service would refuse at start
    assert settings.port == SETTINGS_PORT


# --- Dockerfile ---------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_dockerfile_serves_the_settings_port_as_non_root_with_a_healthcheck():
    instructions = dockerfile()
    by = {}
    for op, arg in instructions:
        by.setdefault(op, []).append(arg)
    exposed = {int(p) for arg in by["EXPOSE"] for p in arg.split()}
    assert exposed == {SETTINGS_PORT, int(flag(SCORER_COMMAND, "--port"))}
    cmd = json.loads(by["CMD"][-1])
    assert cmd == ["egrm", "serve", "--host", "0.0.0.0"]
    args = build_parser().parse_args(cmd[1:])  # the real CLI takes it
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port is None  # port: EGRM_PORT
    assert by["USER"][-1] not in ("root", "0")
    (healthcheck,) = by["HEALTHCHECK"]
    assert "/healthz" in healthcheck and f"'EGRM_PORT', '{SETTINGS_PORT}'" in healthcheck
    assert f"EGRM_PORT={SETTINGS_PORT}" in " ".join(by["ENV"])


def test_dockerfile_build_args_default_to_the_cpu_build_the_makefile_uses():
    args = dict(arg.split("=", 1) for op, arg in dockerfile() if op == "ARG" and "=" in arg)
    assert args["BASE_IMAGE"] == "python:3.11-slim"
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    makefile_spec = re.search(r"^TORCH_SPEC \?= (\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert makefile_spec and args["TORCH_SPEC"].strip('"') == makefile_spec.group(1)
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    assert ignored[0] == "*" and {"!egrm/", "!pyproject.toml", "!README.md"} <= set(ignored)


# --- docker compose ------------------------------------------------------------------------------


def test_compose_services_ports_and_wiring():
    assert set(SERVICES) == {
        "api",
        "scorer",
        "redis",
        "prometheus",
        "grafana",
        "locust",
        "vllm",
        "served-tokenizer",
        *GPU_SERVICES,
    }
    api, scorer = SERVICES["api"], SERVICES["scorer"]
    assert api["ports"] == [f"{SETTINGS_PORT}:{compose_port('api')}"] and compose_port("api") == SETTINGS_PORT
    assert scorer["command"] == SCORER_COMMAND
    assert f":{compose_port('scorer')}/healthz" in " ".join(scorer["healthcheck"]["test"])
    assert api["environment"]["EGRM_SCORER_URL"] == f"http://scorer:{compose_port('scorer')}"
    assert api["environment"]["EGRM_SGLANG_URL"] == f"http://sglang:{compose_port('sglang')}"
    assert interpolate(api["environment"]["EGRM_ENGINE"]) == Settings.model_fields["engine"].default


def redis_flags_bound_it_in_memory(args: list[str]) -> None:
    """As the tests' redis-server runs (loadtest/serverproc.redis_server): no persistence, bytes
    bounded with the least recently used out (the store's entries and bytes bound)."""
    assert flag(args, "--save") == "" and flag(args, "--appendonly") == "no"
    assert flag(args, "--maxmemory-policy") == "allkeys-lru" and flag(args, "--maxmemory").endswith("mb")


def test_compose_replicas_share_question_work_through_its_redis():
    api, redis = SERVICES["api"], SERVICES["redis"]
    url = urlsplit(api["environment"]["EGRM_SHARE_URL"])
    assert (url.scheme, url.hostname, url.port) == ("redis", "redis", 6379) and redis["expose"] == ["6379"]
    assert redis["command"][0] == "redis-server"
    redis_flags_bound_it_in_memory(redis["command"])
    assert api["depends_on"]["redis"] == {"condition": "service_healthy"}


def test_k8s_replicas_share_question_work_through_the_redis_service():
    url = urlsplit(k8s("ConfigMap", "egrm-config")["data"]["EGRM_SHARE_URL"])
    service = k8s("Service", "redis")
    assert (url.scheme, url.hostname) == ("redis", service["metadata"]["name"])
    assert [p["port"] for p in service["spec"]["ports"]] == [url.port]
    redis_flags_bound_it_in_memory(container(workload("redis"))["args"])


def test_compose_sglang_and_dcgm_exporter_are_gpu_profile_services():
    sglang, dcgm = SERVICES["sglang"], SERVICES["dcgm-exporter"]
    assert interpolate(sglang["image"]).startswith("lmsysorg/sglang")
    assert sglang["command"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert flag(sglang["command"], "--host") == "0.0.0.0"
    assert interpolate(dcgm["image"]).startswith("nvcr.io/nvidia/k8s/dcgm-exporter:")
    for svc in (sglang, dcgm):
        (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert svc["profiles"] == ["gpu"] and device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    runtime_only = GPU_SERVICES | {"vllm", "served-tokenizer"}
    assert all("profiles" not in svc for name, svc in SERVICES.items() if name not in runtime_only)


def vllm_flags_of_the_measured_server(args: list[str]) -> None:
    """The flags egrm's vLLM tests and benchmarks run with (loadtest/serverproc.vllm_server) that
    matter on a GPU too: cached-token counts in usage, no sampling defaults from the model's files."""
    assert "--enable-prompt-tokens-details" in args and flag(args, "--generation-config") == "vllm"
    assert "--disable-uvicorn-access-log" in args
    assert flag(args, "--scheduling-policy") == "priority"  # egrm's spare and background calls wait


def test_compose_vllm_is_the_api_openai_engine_in_its_profile():
    vllm, env = SERVICES["vllm"], SERVICES["api"]["environment"]
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert vllm["profiles"] == ["vllm"] and device["capabilities"] == ["gpu"]
    assert interpolate(vllm["image"]).startswith("vllm/vllm-openai")
    vllm_flags_of_the_measured_server(vllm["command"])
    assert env["EGRM_OPENAI_URL"] == f"http://vllm:{compose_port('vllm')}/v1" and env["EGRM_OPENAI_DIALECT"] == "vllm"
    assert flag(vllm["command"], "--served-model-name") == env["EGRM_OPENAI_MODEL"]


def test_the_vllm_overlay_swaps_sglang_for_vllm_runtimes_the_api_reaches():
    kustomization = load_yaml(VLLM_DIR / "kustomization.yaml")[0]
    assert kustomization["resources"] == ["../k8s", "vllm.yaml"]
    deleted = [yaml.safe_load(p["patch"]) for p in kustomization["patches"] if "$patch: delete" in p["patch"]]
    sglang = {(d["kind"], d["metadata"]["name"]) for d in K8S if "sglang" in d["metadata"]["name"]}
    assert {(d["kind"], d["metadata"]["name"]) for d in deleted} == sglang
    (config,) = [p for p in kustomization["patches"] if p.get("target", {}).get("name") == "egrm-config"]
    data = {op["path"].removeprefix("/data/"): op["value"] for op in yaml.safe_load(config["patch"])}
    assert data["EGRM_ENGINE"] == "openai" and data["EGRM_OPENAI_DIALECT"] == "vllm"
    Settings(**{k.removeprefix("EGRM_").lower(): v for k, v in data.items()})  # valid together
    docs = load_yaml(VLLM_DIR / "vllm.yaml")
    (service,) = [d for d in docs if d["kind"] == "Service"]
    (runtime,) = [d for d in docs if d["kind"] == "Deployment"]
    url = urlsplit(data["EGRM_OPENAI_URL"])
    assert url.hostname == service["metadata"]["name"] and url.path == "/v1"
    assert [p["port"] for p in service["spec"]["ports"]] == [url.port]
    # A question's calls meet their prefix cache on one runtime: each api pod keeps to one.
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    c = container(runtime)
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": url.port}
    assert (
        int(flag(c["args"], "--port")) == url.port
        and flag(c["args"], "--served-model-name") == data["EGRM_OPENAI_MODEL"]
    )
    vllm_flags_of_the_measured_server(c["args"])
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert probe_path_and_port(c, "readinessProbe") == ("/health", url.port)


def test_the_api_pods_tokenize_with_the_model_the_runtimes_serve():
    """egrm sends the runtime token ids: EGRM_MODEL is the folder the api pod's init container fills
    with the served model's tokenizer files, the model SGLang's workers and the vLLM overlay serve."""
    api = workload("egrm-api")["spec"]["template"]["spec"]
    (init,) = api["initContainers"]
    served = flag(container(workload("sglang-worker"))["command"], "--model-path")
    assert init["image"] == container(workload("egrm-api"))["image"]
    assert init["command"][:3] == ["hf", "download", served] and "*.safetensors" not in init["command"]
    folder = flag(init["command"], "--local-dir")
    assert k8s("ConfigMap", "egrm-config")["data"]["EGRM_MODEL"] == folder and folder in POD_FOLDERS
    (mount,) = init["volumeMounts"]
    assert mount["mountPath"] == folder
    assert {"name": mount["name"], "mountPath": folder, "readOnly": True} in container(workload("egrm-api"))[
        "volumeMounts"
    ]
    assert {"name": mount["name"], "emptyDir": {}} in api["volumes"]
    (runtime,) = [d for d in load_yaml(VLLM_DIR / "vllm.yaml") if d["kind"] == "Deployment"]
    assert container(runtime)["args"][0] == served


def test_compose_api_can_tokenize_with_the_model_the_runtimes_serve():
    """Beside a runtime (profiles gpu and vllm) served-tokenizer fetches the tokenizer files of the
    model SGLang and vLLM serve into the volume the api mounts, at the folder the header's commands
    set EGRM_MODEL to; the api waits for it there, and starts without it on the embedded engine."""
    init, api = SERVICES["served-tokenizer"], SERVICES["api"]
    served = flag(SERVICES["sglang"]["command"], "--model-path")
    assert SERVICES["vllm"]["command"][0] == served and "SERVED_MODEL" in served
    assert init["command"][:3] == ["hf", "download", served] and "*.safetensors" not in init["command"]
    assert set(init["profiles"]) == {*SERVICES["sglang"]["profiles"], *SERVICES["vllm"]["profiles"]}
    assert init["image"] == api["image"] and init["restart"] == "no"
    folder = flag(init["command"], "--local-dir")
    volume = init["volumes"][0].split(":")[0]
    assert init["volumes"] == [f"{volume}:{folder}"] and f"{volume}:{folder}:ro" in api["volumes"]
    assert volume in COMPOSE["volumes"]
    assert api["depends_on"]["served-tokenizer"] == {"condition": "service_completed_successfully", "required": False}
    header = (ROOT / "docker-compose.yml").read_text().split("\nname:")[0]
    for profile in ("gpu", "vllm"):
        (command,) = [line for line in header.splitlines() if f"--profile {profile} " in line]
        assert f"EGRM_MODEL={folder} " in command


def test_sglang_runtimes_honour_sampling_seeds():
    """SGLang samples with a request's sampling_seed only in deterministic mode."""
    for command in SERVICES["sglang"]["command"], container(k8s("StatefulSet", "sglang-worker"))["command"]:
        assert "--enable-deterministic-inference" in command


def test_compose_mounts_exist_and_locust_runs_the_project_locustfile():
    for svc in ("prometheus", "grafana", "locust"):
        for volume in SERVICES[svc]["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume
    locust = SERVICES["locust"]
    mount = dict(v.split(":")[:2] for v in locust["volumes"])["./loadtest"]
    assert flag(locust["command"], "-f") == f"{mount}/locustfile.py"
    assert flag(locust["command"], "--host") == f"http://api:{compose_port('api')}"


def test_prometheus_scrapes_compose_services_on_their_ports_and_every_exporter_the_dashboard_reads():
    config = load_yaml(ROOT / "deploy" / "prometheus.yml")[0]
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    for target in targets:
        host, port = target.split(":")
        assert host in SERVICES and int(port) == compose_port(host), target
    served = {exporters()[name].compose for name in dashboard_exporters()} - {None}
    assert {f"{name}:{compose_port(name)}" for name in served | {"scorer"}} <= targets
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in config["scrape_configs"])


def test_grafana_provisioning_points_at_the_dashboard_and_the_datasource_uid():
    grafana = SERVICES["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    provider = load_yaml(ROOT / "deploy/grafana/provisioning/dashboards/egrm.yml")[0]["providers"][0]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    (datasource,) = load_yaml(ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml")[0]["datasources"]
    assert datasource["url"] == "http://prometheus:9090" and "9090:9090" in SERVICES["prometheus"]["ports"]
    dashboard = json.loads(DASHBOARD.read_text())
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {datasource["uid"]}


# --- Kubernetes ----------------------------------------------------------------------------------


def probe_path_and_port(c: dict, probe: str) -> tuple[str, int]:
    get = c[probe]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    return get["path"], ports.get(get["port"], get["port"])


def test_api_deployment_probes_port_env_and_resources():
    api = k8s("Deployment", "egrm-api")
    c = container(api)
    assert probe_path_and_port(c, "livenessProbe") == ("/healthz", SETTINGS_PORT)
    assert probe_path_and_port(c, "readinessProbe") == ("/readyz", SETTINGS_PORT)
    # Readiness answers from a check made in the background, which gives up after 1 s: the probe
    # waits longer than that, and the deadline OpenRLHF retries after is longer than egrm's.
    assert all(c[p]["timeoutSeconds"] >= 2 for p in ("livenessProbe", "readinessProbe", "startupProbe"))
    assert float(k8s("ConfigMap", "egrm-config")["data"]["EGRM_REQUEST_TIMEOUT_S"]) < 180
    assert c["command"] == ["egrm", "serve", "--host", "0.0.0.0"]
    config = k8s("ConfigMap", "egrm-config")["data"]
    assert {"configMapRef": {"name": "egrm-config"}} in c["envFrom"]
    assert int(config["EGRM_PORT"]) == SETTINGS_PORT
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert api["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > int(config["EGRM_SHUTDOWN_GRACE_S"])
    hpa = k8s("HorizontalPodAutoscaler", "egrm-api")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "egrm-api"}
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]


def test_every_service_selects_a_workload_and_targets_a_named_container_port():
    workloads = [d for d in K8S if d["kind"] in WORKLOAD_KINDS]
    for service in (d for d in K8S if d["kind"] == "Service"):
        selected = [
            w
            for w in workloads
            if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, service["metadata"]["name"]
        ports = {p["name"]: p["containerPort"] for p in container(selected[0])["ports"]}
        for port in service["spec"]["ports"]:
            assert ports[port["targetPort"]] == port["port"], service["metadata"]["name"]


def test_scorer_deployment_and_the_api_url_that_reaches_it():
    c = container(k8s("Deployment", "egrm-scorer"))
    assert c["command"] == SCORER_COMMAND
    port = int(flag(c["command"], "--port"))
    assert probe_path_and_port(c, "livenessProbe") == ("/healthz", port)
    assert probe_path_and_port(c, "readinessProbe") == ("/readyz", port)
    url = urlsplit(k8s("ConfigMap", "egrm-config")["data"]["EGRM_SCORER_URL"])
    service = k8s("Service", url.hostname)
    assert [p["port"] for p in service["spec"]["ports"]] == [url.port]


def test_sglang_runtimes_behind_the_cache_aware_router():
    workers = k8s("StatefulSet", "sglang-worker")
    wc = container(workers)
    assert wc["command"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert wc["resources"]["limits"]["nvidia.com/gpu"] == 1
    port = int(flag(wc["command"], "--port"))
    assert k8s("Service", workers["spec"]["serviceName"])["spec"]["clusterIP"] == "None"  # per-pod DNS
    pod = container(k8s("Deployment", "sglang-router"))
    # smg (smg-project/smg f8daa88): the image's entrypoint is `python3 -m smg.launch_router`.
    assert pod["image"].startswith("lightseekorg/smg:") and "command" not in pod
    router = pod["args"]
    assert flag(router, "--policy") == "cache_aware"
    # A batch routes on its first prompt's tokens: it matches its warm-up whole, and a long-path
    # continuation matches its prompt's worker by over 3/4 (see the manifest's comment).
    assert 0 < float(flag(router, "--cache-threshold")) < 0.75
    start = router.index("--worker-urls") + 1
    urls = router[start : start + workers["spec"]["replicas"] + 1]
    assert urls[:-1] == [
        f"http://sglang-worker-{i}.{workers['spec']['serviceName']}:{port}" for i in range(workers["spec"]["replicas"])
    ]
    assert urls[-1].startswith("--")  # exactly one URL per replica
    url = urlsplit(k8s("ConfigMap", "egrm-config")["data"]["EGRM_SGLANG_URL"])
    router_service = k8s("Service", url.hostname)
    assert [p["port"] for p in router_service["spec"]["ports"]] == [url.port] == [int(flag(router, "--port"))]


# --- the dashboard against the service's real /metrics -------------------------------------------


def exposition_names_and_labels(text: str) -> dict[str, set[str]]:
    """Metric name -> label names seen, from a Prometheus text exposition (families expand by type)."""
    names: dict[str, set[str]] = {}
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            for suffix in suffixes[kind]:
                names.setdefault(family.removesuffix("_total") + suffix, set())
        elif line and not line.startswith("#"):
            match = re.match(r"(\w+)(?:\{(.*)\})? ", line)
            assert match, line
            labels = re.findall(r'(\w+)="', match.group(2) or "")
            names.setdefault(match.group(1), set()).update(labels)
    return names


@pytest.fixture(scope="module")
def real_metrics(engine) -> dict[str, set[str]]:
    item = {"prompt": "What is 2+2?", "response": "4"}
    with TestClient(create_app(Settings(), engine=engine)) as c:
        assert c.get("/readyz").status_code == 200  # no GPU here: the app starts all the same
        assert c.post("/v1/rewards", json={"items": [item], "options": {"path": "short"}}).status_code == 200
        text = c.get("/metrics").text
    # A deadline no model call meets: the cancelled-requests counter gets its `reason` label.
    with TestClient(create_app(Settings(request_timeout_s=0.001), engine=engine)) as c:
        assert c.post("/v1/rewards", json={"items": [item]}).status_code == 504
        text += c.get("/metrics").text
    # GPU series exist only where NVML finds a GPU: take them from metrics.py fed by the NVML stand-in.
    monitor, gpu_metrics = GpuMonitor(interval_s=3600, nvml=FakeNvml()), Metrics()
    gpu_metrics.watch_gpus(monitor.latest)
    monitor.start()
    monitor.close()
    return exposition_names_and_labels(text + gpu_metrics.render().decode())


@pytest.mark.slow
def test_the_app_without_a_gpu_serves_metrics_but_no_gpu_series(engine):
    with TestClient(create_app(Settings(), engine=engine)) as c:
        assert c.get("/healthz").status_code == 200
        text = c.get("/metrics").text
    assert "egrm_request_latency_seconds" in text and "egrm_gpu" not in text


def dashboard_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(t["expr"], t.get("legendFormat", "")) for p in panels for t in p["targets"]]


_PROMQL_WORDS = {"sum", "avg", "min", "max", "count", "by", "without", "rate", "increase", "histogram_quantile", "or"}


def series_in(expr: str) -> set[str]:
    """The series a PromQL expression reads: its names less functions, keywords, matchers and ranges."""
    bare = re.sub(r'\{[^}]*\}|\[[^\]]*\]|by \([^)]*\)|"[^"]*"', " ", expr)
    return set(re.findall(r"[A-Za-z_:][\w:]*", bare)) - _PROMQL_WORDS


def histogram(name: str) -> set[str]:
    return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}


# NVIDIA/dcgm-exporter etc/default-counters.csv: the fields collected by default (its uncommented lines).
DCGM_SERIES = frozenset(
    f"DCGM_FI_DEV_{field}"
    for field in (
        *("SM_CLOCK", "MEM_CLOCK", "MEMORY_TEMP", "GPU_TEMP", "POWER_USAGE", "TOTAL_ENERGY_CONSUMPTION"),
        *("PCIE_TX_THROUGHPUT", "PCIE_RX_THROUGHPUT", "PCIE_REPLAY_COUNTER"),
        *("GPU_UTIL", "MEM_COPY_UTIL", "ENC_UTIL", "DEC_UTIL", "XID_ERRORS", "FB_FREE", "FB_USED"),
        *("NVLINK_BANDWIDTH_TOTAL", "VGPU_LICENSE_STATUS"),
        *("UNCORRECTABLE_REMAPPED_ROWS", "CORRECTABLE_REMAPPED_ROWS", "ROW_REMAP_FAILURE"),
    )
)
# NVIDIA/dcgm-exporter README.md: `gpu` and `UUID` per GPU; in Kubernetes the pod that holds it.
DCGM_LABELS = frozenset({"gpu", "UUID", "pod", "namespace", "container"})

# sgl-project/sglang python/sglang/srt/metrics/collector.py: SchedulerMetricsCollector's gauges and
# TokenizerMetricsCollector's counters and histograms (the ones a dashboard reads; it has more).
# Their own labels (model name, ranks) vary by release: the dashboard groups by target only.
SGLANG_SERIES = frozenset(
    {
        *("sglang:num_running_reqs", "sglang:num_used_tokens", "sglang:token_usage", "sglang:gen_throughput"),
        *("sglang:num_queue_reqs", "sglang:num_grammar_queue_reqs", "sglang:cache_hit_rate"),
        *("sglang:max_total_num_tokens", "sglang:prompt_tokens_total", "sglang:generation_tokens_total"),
        *("sglang:cached_tokens_total", "sglang:num_requests_total", "sglang:num_aborted_requests_total"),
        *histogram("sglang:time_to_first_token_seconds"),
        *histogram("sglang:inter_token_latency_seconds"),
        *histogram("sglang:e2e_request_latency_seconds"),
    }
)

# sgl-project/sglang sgl-model-gateway/src/observability/metrics.rs: init_metrics' layered smg_*
# series (the *_duration_seconds ones get buckets in start_prometheus) and the labels Metrics sets.
ROUTER_SERIES = frozenset(
    {
        *("smg_http_requests_total", "smg_http_responses_total", "smg_http_connections_active"),
        *("smg_router_requests_total", "smg_router_request_errors_total", "smg_router_upstream_responses_total"),
        *("smg_worker_pool_size", "smg_worker_requests_active", "smg_worker_health", "smg_worker_selection_total"),
        *("smg_worker_errors_total", "smg_worker_cb_state", "smg_worker_retries_total"),
        *histogram("smg_http_request_duration_seconds"),
        *histogram("smg_router_request_duration_seconds"),
    }
)
ROUTER_LABELS = frozenset(
    {"method", "path", "status_code", "router_type", "backend_type", "connection_mode", "model", "endpoint"}
    | {"streaming", "error_type", "worker", "worker_type", "policy"}
)

TARGET_LABELS = frozenset({"instance", "job"})  # Prometheus adds them to every series it scrapes


def registered_series(registry: CollectorRegistry) -> frozenset[str]:
    """Series names of every family a registry holds, with samples or not, as a scrape names them."""
    suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}
    return frozenset(family.name + suffix for family in registry.collect() for suffix in suffixes[family.type])


@dataclass(frozen=True)
class Exporter:
    series: frozenset[str]
    labels: frozenset[str] | None  # None: checked against the real service's /metrics (slow test)
    compose: str | None  # the compose service that serves them; None: not part of compose
    k8s: str  # the workload that serves them


@cache
def exporters() -> dict[str, Exporter]:
    metrics = Metrics()  # egrm's own: what egrm/metrics.py registers, engine and GPU collectors included
    metrics.watch_engine(EngineStats)
    metrics.watch_sharing(SharingStats)
    monitor = GpuMonitor(interval_s=3600, nvml=FakeNvml())
    metrics.watch_gpus(monitor.latest)
    monitor.start()
    monitor.close()
    return {
        "egrm": Exporter(registered_series(metrics.registry), None, "api", "egrm-api"),
        "sglang": Exporter(SGLANG_SERIES, frozenset(), "sglang", "sglang-worker"),
        "router": Exporter(ROUTER_SERIES, ROUTER_LABELS, None, "sglang-router"),
        "dcgm": Exporter(DCGM_SERIES, DCGM_LABELS, "dcgm-exporter", "dcgm-exporter"),
    }


def dashboard_exporters() -> set[str]:
    used = set().union(*(series_in(expr) for expr, _ in dashboard_queries()))
    return {name for name, e in exporters().items() if used & e.series}


def test_the_dashboard_has_the_required_panels():
    titles = " | ".join(p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]).lower()
    for needed in ("latency p50 / p99 by route", "short-path rate", "consensus", "gpu utilisation", "queue depth"):
        assert needed in titles
    assert dashboard_exporters() == set(exporters())  # GPU, runtime and router series beside egrm's


def labels_in(expr: str, legend: str) -> set[str]:
    """Label names a query groups by, matches on or shows in its legend."""
    groups = re.findall(r"by \(([^)]*)\)", expr)
    labels = {name.strip() for group in groups for name in group.split(",")}
    labels |= set(re.findall(r"\{\{(\w+)\}\}", legend)) | set(re.findall(r"[{,]\s*(\w+)\s*[=!~]", expr))
    return labels - {"le"}


@pytest.mark.parametrize(("expr", "legend"), dashboard_queries())
def test_every_dashboard_series_is_one_its_exporter_serves(expr, legend):
    used = series_in(expr)
    owners = {name for name, e in exporters().items() if used & e.series}
    assert len(owners) == 1, f"{used} served by {owners or 'no exporter'}"
    exporter = exporters()[owners.pop()]
    assert used <= exporter.series, used - exporter.series
    if exporter.labels is not None:  # egrm's labels: the slow test below, against the real service
        assert labels_in(expr, legend) <= exporter.labels | TARGET_LABELS, labels_in(expr, legend)


def test_every_exporter_the_dashboard_reads_is_a_scraped_pod_in_kubernetes():
    for name in dashboard_exporters():
        pod = workload(exporters()[name].k8s)["spec"]["template"]
        annotations = pod["metadata"]["annotations"]
        ports = {p["containerPort"] for p in container({"spec": {"template": pod}})["ports"]}
        assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) in ports, name
    router = container(k8s("Deployment", "sglang-router"))["args"]
    annotations = k8s("Deployment", "sglang-router")["spec"]["template"]["metadata"]["annotations"]
    assert flag(router, "--prometheus-port") == annotations["prometheus.io/port"]
    assert flag(router, "--prometheus-host") == "0.0.0.0"  # some releases default to 127.0.0.1


@pytest.mark.slow
@pytest.mark.parametrize(("expr", "legend"), [q for q in dashboard_queries() if "egrm_" in q[0]])
def test_every_dashboard_query_uses_real_metric_names_and_labels(real_metrics, expr, legend):
    used = set(re.findall(r"\begrm_\w+", expr))
    assert used and used <= set(real_metrics), used - set(real_metrics)
    available = set().union(*(real_metrics[name] for name in used))
    assert labels_in(expr, legend) <= available, labels_in(expr, legend) - available
