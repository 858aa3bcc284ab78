"""deploy/k8s: schema validation against the Kubernetes OpenAPI schemas (kubernetes-validate,
offline, strict: unknown fields fail) plus the semantic links a schema cannot see: selectors,
ports, probe paths, the proxy config and the Secret keys it needs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvmigrate.config import parse_config
from kvmigrate.proxy import build_proxy_app

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
# The oldest Kubernetes minor still commonly run, and the newest the validator ships.
K8S_VERSIONS = ("1.29.0", "1.37.0")
NAMESPACE = "kvmigrate"
SECRET = "kvmigrate-secrets"
VLLM_FLAGS = (
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--enable-auto-tool-choice",
    "--tool-call-parser=llama3_json",
    "--max-model-len=",
    "--gpu-memory-utilization=",
)
VLLM_PROBE_PATHS = {"/health"}

Doc = dict[str, Any]


def _load_all(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


KUSTOMIZATION: Doc = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
RESOURCES: list[tuple[str, Doc]] = [
    (name, doc) for name in KUSTOMIZATION["resources"] for doc in _load_all(K8S / name)
]
SECRET_EXAMPLE: Doc = _load_all(K8S / "secret.example.yaml")[0]
CONFIG_TEXT = (K8S / "config.yaml").read_text(encoding="utf-8")


def _generated_configmaps() -> list[Doc]:
    """The ConfigMaps kustomize's configMapGenerator makes (less the name hash suffix)."""
    out = []
    for gen in KUSTOMIZATION.get("configMapGenerator", []):
        data = {}
        for item in gen["files"]:
            key, _, file = item.rpartition("=")
            data[key or Path(file).name] = (K8S / file).read_text(encoding="utf-8")
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"]},
                "data": data,
            }
        )
    return out


def _rendered() -> list[Doc]:
    """Roughly what `kubectl kustomize deploy/k8s` emits: resources + generated ConfigMaps,
    all in the kustomization's namespace (the image override is checked separately)."""
    docs = [doc for _, doc in RESOURCES] + _generated_configmaps()
    for doc in docs:
        if doc["kind"] != "Namespace":
            doc.setdefault("metadata", {}).setdefault("namespace", KUSTOMIZATION["namespace"])
    return docs


RENDERED = _rendered()
ALL_VALIDATED = [*RENDERED, SECRET_EXAMPLE]


def _by_kind(kind: str) -> list[Doc]:
    return [d for d in RENDERED if d["kind"] == kind]


def _workloads() -> list[Doc]:
    return [d for d in RENDERED if d["kind"] in ("Deployment", "StatefulSet")]


def _workload(name: str) -> Doc:
    return next(d for d in _workloads() if d["metadata"]["name"] == name)


def _pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _containers(workload: Doc) -> list[Doc]:
    containers: list[Doc] = workload["spec"]["template"]["spec"]["containers"]
    return containers


def _fake_env() -> dict[str, str]:
    """The Secret's documented placeholder values: they are valid URLs where a URL is due."""
    env: dict[str, str] = SECRET_EXAMPLE["stringData"]
    return dict(env)


def _env_refs(text: str) -> set[str]:
    """The NAMEs of the os.environ/NAME values in a config (comments do not count)."""

    def walk(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [n for v in node.values() for n in walk(v)]
        if isinstance(node, list):
            return [n for v in node for n in walk(v)]
        if isinstance(node, str) and node.startswith("os.environ/"):
            return [node.removeprefix("os.environ/")]
        return []

    return set(walk(yaml.safe_load(text)))


def _host_port(url: str) -> tuple[str, int | None]:
    m = re.match(r"^[a-z]+://(?:[^@/]*@)?([^:/]+)(?::(\d+))?", url)
    assert m, url
    return m.group(1), int(m.group(2)) if m.group(2) else None


def _service(name: str) -> Doc:
    found = [s for s in _by_kind("Service") if s["metadata"]["name"] == name]
    assert found, f"no Service named {name!r} in deploy/k8s"
    return found[0]


# --- schema --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "doc", ALL_VALIDATED, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in ALL_VALIDATED]
)
def test_manifest_is_valid_against_the_kubernetes_schema(doc: Doc, version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path)
        pytest.fail(
            f"{doc['kind']}/{doc['metadata']['name']} (k8s {version}) at {where}: {exc.message}"
        )


def test_kustomization_lists_every_manifest_and_nothing_missing() -> None:
    assert KUSTOMIZATION["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert KUSTOMIZATION["namespace"] == NAMESPACE
    listed = set(KUSTOMIZATION["resources"])
    for name in listed:
        assert (K8S / name).is_file(), name
    not_resources = {"kustomization.yaml", "config.yaml", "secret.example.yaml"}
    on_disk = {p.name for p in K8S.glob("*.yaml")} - not_resources
    assert on_disk == listed, "every manifest in deploy/k8s/ is applied (or moved to optional/)"
    # The Secret holds real credentials: it must never be applied from the repository.
    assert all(doc["kind"] != "Secret" for doc in RENDERED)
    # Names are unique per kind.
    keys = [(d["kind"], d["metadata"]["name"]) for d in RENDERED]
    assert len(keys) == len(set(keys)), keys
    namespaces = _by_kind("Namespace")
    assert [n["metadata"]["name"] for n in namespaces] == [NAMESPACE]
    for doc in RENDERED:
        assert doc["metadata"].get("namespace", NAMESPACE) == NAMESPACE


def test_optional_servicemonitor_is_kept_out_of_the_default_kustomization() -> None:
    optional = K8S / "optional"
    kust = yaml.safe_load((optional / "kustomization.yaml").read_text(encoding="utf-8"))
    docs = [d for name in kust["resources"] for d in _load_all(optional / name)]
    assert {d["kind"] for d in docs} == {"ServiceMonitor"}
    assert not any(r.startswith("optional") for r in KUSTOMIZATION["resources"])
    services = {s["metadata"]["name"]: s for s in _by_kind("Service")}
    for monitor in docs:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        selected = [
            s
            for s in services.values()
            if _matches(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert selected, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        port_names = {p["name"] for s in selected for p in s["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in port_names


# --- images --------------------------------------------------------------------------------


def _images() -> list[tuple[str, str]]:
    out = []
    for workload in _workloads():
        spec = workload["spec"]["template"]["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            out.append((workload["metadata"]["name"], c["image"]))
    return out


@pytest.mark.parametrize(("workload", "image"), _images())
def test_images_are_pinned_to_a_version_tag(workload: str, image: str) -> None:
    _name, sep, tag = image.rpartition(":")
    assert sep, f"{workload}: {image} has no tag"
    assert "/" not in tag, f"{workload}: {image} has no tag"
    assert tag != "latest", f"{workload}: {image} is not pinned"
    assert re.search(r"\d+\.\d+", tag), f"{workload}: {image} is not a version tag"


def test_kustomize_image_override_targets_the_proxy_image() -> None:
    proxy_image = _containers(_workload("kvmigrate-proxy"))[0]["image"]
    overrides = {i["name"]: i for i in KUSTOMIZATION["images"]}
    name, _, tag = proxy_image.rpartition(":")
    assert name in overrides
    assert overrides[name]["newTag"] == tag != "latest"


# --- selectors, ports, probes ----------------------------------------------------------------


@pytest.mark.parametrize("workload", _workloads(), ids=lambda w: w["metadata"]["name"])
def test_workload_selector_matches_its_pod_labels(workload: Doc) -> None:
    assert _matches(workload["spec"]["selector"]["matchLabels"], _pod_labels(workload))
    for spread in workload["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
        assert _matches(spread["labelSelector"]["matchLabels"], _pod_labels(workload))


@pytest.mark.parametrize("service", _by_kind("Service"), ids=lambda s: s["metadata"]["name"])
def test_service_selects_one_workload_and_targets_a_container_port(service: Doc) -> None:
    selected = [w for w in _workloads() if _matches(service["spec"]["selector"], _pod_labels(w))]
    assert len(selected) == 1, f"Service {service['metadata']['name']} selects {len(selected)}"
    ports = [p for c in _containers(selected[0]) for p in c.get("ports", [])]
    for port in service["spec"]["ports"]:
        target = port["targetPort"]
        if isinstance(target, str):
            assert target in {p.get("name") for p in ports}, target
        else:
            assert target in {p["containerPort"] for p in ports}, target
    if selected[0]["kind"] == "StatefulSet":
        assert selected[0]["spec"]["serviceName"] == service["metadata"]["name"]


def test_pdb_and_network_policies_select_real_pods() -> None:
    pods = [_pod_labels(w) for w in _workloads()]
    for pdb in _by_kind("PodDisruptionBudget"):
        chosen = [
            w
            for w in _workloads()
            if _matches(pdb["spec"]["selector"]["matchLabels"], _pod_labels(w))
        ]
        assert len(chosen) == 1
        replicas = chosen[0]["spec"]["replicas"]
        assert 0 < pdb["spec"]["minAvailable"] < replicas, "the PDB must still allow a drain"
    for policy in _by_kind("NetworkPolicy"):
        target = [
            w
            for w in _workloads()
            if _matches(policy["spec"]["podSelector"]["matchLabels"], _pod_labels(w))
        ]
        assert len(target) == 1, policy["metadata"]["name"]
        container_ports = {p["containerPort"] for c in _containers(target[0]) for p in c["ports"]}
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                assert any(_matches(peer["podSelector"]["matchLabels"], labels) for labels in pods)
            for port in rule["ports"]:
                assert port["port"] in container_ports


def _probes(container: Doc) -> list[tuple[str, Doc]]:
    return [
        (k, container[k])
        for k in ("startupProbe", "readinessProbe", "livenessProbe")
        if k in container
    ]


@pytest.mark.parametrize("workload", _workloads(), ids=lambda w: w["metadata"]["name"])
def test_probes_point_at_declared_ports(workload: Doc) -> None:
    for container in _containers(workload):
        names = {p.get("name") for p in container.get("ports", [])}
        numbers = {p["containerPort"] for p in container.get("ports", [])}
        assert {"readinessProbe", "livenessProbe"} <= dict(_probes(container)).keys()
        for kind, probe in _probes(container):
            handler = probe.get("httpGet") or probe.get("tcpSocket")
            if handler is None:
                assert probe.get("exec"), kind
                continue
            port = handler["port"]
            assert port in (names if isinstance(port, str) else numbers), f"{kind} port {port}"


def test_proxy_probes_use_routes_the_proxy_serves() -> None:
    env = _fake_env()
    config = parse_config(CONFIG_TEXT, "deploy/k8s/config.yaml", env)
    app = build_proxy_app(config)
    served = {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource}
    proxy = _containers(_workload("kvmigrate-proxy"))[0]
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/health"
    for _, probe in _probes(proxy):
        assert probe["httpGet"]["path"] in served
    # /ready probes the primary with a 3 s timeout: the probe must wait longer than that.
    assert proxy["readinessProbe"]["timeoutSeconds"] > 3
    annotations = _workload("kvmigrate-proxy")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] in served
    assert int(annotations["prometheus.io/port"]) == proxy["ports"][0]["containerPort"]


# --- the proxy Deployment --------------------------------------------------------------------


def test_proxy_deployment_is_replicated_spread_and_locked_down() -> None:
    deployment = _workload("kvmigrate-proxy")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] >= 3
    assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} >= {
        "kubernetes.io/hostname"
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (proxy,) = pod["containers"]
    ctx = proxy["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert proxy["resources"]["requests"]
    assert proxy["resources"]["limits"]["memory"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in proxy["volumeMounts"]}
    for name in mounts.values():
        assert name in volumes
    # The image's writable state dir and /tmp are emptyDirs, so the root FS can be read-only.
    assert "emptyDir" in volumes[mounts["/var/lib/kvmigrate"]]
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert any(
        p["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
        for p in _by_kind("PodDisruptionBudget")
    )


def test_proxy_config_is_the_generated_configmap_mounted_where_the_command_reads_it() -> None:
    proxy = _containers(_workload("kvmigrate-proxy"))[0]
    args = proxy["args"]
    config_path = args[args.index("--config") + 1]
    pod = _workload("kvmigrate-proxy")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in proxy["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    configmap = volumes[mount["name"]]["configMap"]
    generated = {c["metadata"]["name"]: c for c in _generated_configmaps()}
    assert configmap["name"] in generated
    filename = config_path[len(mount["mountPath"]) + 1 :]
    item = next(i for i in configmap["items"] if i["path"] == filename)
    assert item["key"] in generated[configmap["name"]]["data"]


# --- config and secrets ----------------------------------------------------------------------


def test_configmap_config_loads_with_the_secret_env_names() -> None:
    env = _fake_env()
    refs = _env_refs(CONFIG_TEXT)
    config = parse_config(CONFIG_TEXT, "deploy/k8s/config.yaml", {k: env[k] for k in refs})
    assert config.server.host == "0.0.0.0"
    assert config.server.master_key is not None
    assert config.server.admin_key is not None
    assert config.rollout.primary == "hosted"
    assert config.rollout.candidate == "vllm"
    # Several replicas share one rollout state and one records database.
    assert config.rollout.state == "redis://kvmigrate-redis:6379/0"
    assert config.record.db.startswith("postgresql://")
    assert "os.environ/KVMIGRATE_RECORD_DB" in CONFIG_TEXT, "the DB URL (a password) is a secret"


def test_config_hosts_are_services_of_this_deployment() -> None:
    config = parse_config(CONFIG_TEXT, "deploy/k8s/config.yaml", _fake_env())
    urls = [config.rollout.state, config.record.db, *config.backends["vllm"].api_bases]
    for url in urls:
        host, port = _host_port(url)
        service = _service(host)
        assert port in {p["port"] for p in service["spec"]["ports"]}, url


def test_every_os_environ_ref_is_set_from_the_secret_in_the_proxy_pod() -> None:
    proxy = _containers(_workload("kvmigrate-proxy"))[0]
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in proxy["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    for name in _env_refs(CONFIG_TEXT):
        assert name in from_secret, f"config.yaml reads os.environ/{name}; the pod does not set it"
        assert from_secret[name]["name"] == SECRET
    assert {"OPENAI_API_KEY", "KVMIGRATE_MASTER_KEY", "KVMIGRATE_ADMIN_KEY"} <= set(from_secret)


def _secret_refs() -> list[tuple[str, str, bool]]:
    refs = []
    for workload in _workloads():
        for c in _containers(workload):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.append((ref["name"], ref["key"], bool(ref.get("optional"))))
    return refs


def test_every_referenced_secret_key_is_documented() -> None:
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    example = SECRET_EXAMPLE["stringData"]
    comment = (K8S / "secret.example.yaml").read_text(encoding="utf-8")
    refs = _secret_refs()
    assert refs
    for name, key, _optional in refs:
        assert name == SECRET
        assert key in example, f"{key} missing from secret.example.yaml"
        assert f"--from-literal={key}=" in comment, f"{key} missing from the kubectl example"
        assert f"`{key}`" in readme, f"{key} not described in deploy/README.md"
    assert set(example) == {key for _, key, _ in refs}, "no undocumented extra keys either"


# --- Redis, PostgreSQL, vLLM -------------------------------------------------------------------


def test_redis_and_postgres_back_the_shared_state() -> None:
    redis = _workload("kvmigrate-redis")
    assert redis["spec"]["replicas"] == 1
    assert redis["spec"]["strategy"]["type"] == "Recreate"
    postgres = _workload("kvmigrate-postgres")
    assert postgres["kind"] == "StatefulSet"
    assert postgres["spec"]["volumeClaimTemplates"]
    for text in ((K8S / "redis.yaml").read_text(), (K8S / "postgres.yaml").read_text()):
        assert "managed" in text.lower(), "say that a managed service is the better choice"


def test_vllm_runs_on_a_gpu_node_with_the_migration_flags() -> None:
    vllm = _workload("vllm")
    pod = vllm["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"].startswith("vllm/vllm-openai:v")
    assert container["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert pod["nodeSelector"]
    command = [*container.get("command", []), *container["args"]]
    for flag in VLLM_FLAGS:
        assert any(a == flag or (flag.endswith("=") and a.startswith(flag)) for a in command), flag
    # The model vLLM serves is the one the proxy maps to the vllm backend.
    config = parse_config(CONFIG_TEXT, "deploy/k8s/config.yaml", _fake_env())
    served = {m.served["vllm"] for m in config.models if "vllm" in m.served}
    model = container["args"][0]
    assert not model.startswith("-")
    assert model in served
    port = next(int(a.split("=", 1)[1]) for a in container["args"] if a.startswith("--port="))
    assert port == container["ports"][0]["containerPort"]
    for _, probe in _probes(container):
        assert probe["httpGet"]["path"] in VLLM_PROBE_PATHS
    volumes = {v["name"]: v for v in pod["volumes"]}
    shm = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert volumes[shm["name"]]["emptyDir"]["medium"] == "Memory"
    env = {e["name"] for e in container["env"]}
    assert "VLLM_API_KEY" in env, "vLLM must require the key the proxy sends"
