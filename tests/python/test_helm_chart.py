"""The Helm chart in deploy/helm/deepinfer: the defaults and every example in its examples/ render with Helm's own
template engine (helm-python-sdk: Helm's Go SDK behind a C interface, no helm binary), pass `helm lint --strict`,
and every manifest validates offline against Kubernetes' strict JSON schemas (kubernetes-validate) for the oldest
Kubernetes the chart allows and the newest the schemas know. The two kinds of custom resources the chart renders
(CRD_KINDS: a ServiceMonitor, a LeaderWorkerSet) have no schema there: their required fields are checked here, and
a LeaderWorkerSet's pod templates are validated as core PodTemplates.

Then the properties a deployment relies on: a pod asks for as many GPUs as the tensor-parallel size, probes
/health with a startup budget fit for loading a large model, runs as a non-root user, gets the API key from a
Secret (as DEEPINFER_API_KEY, never on the command line), and is started with the `deepinfer serve` flags its
values name, each of them a flag the server's CLI really has (read from the CLI's source, so that the C++
extension is never imported); multi-node mode starts every pod with the engine's launch flags from LWS's variables.

Both tools are pinned in requirements-test.txt: in CI (DEEPINFER_CI=1) a missing one fails, elsewhere it skips.
"""

from __future__ import annotations

import ast
import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import require_module, skip_or_fail

# Imported by the _tools fixture: a missing one skips (or, in CI, fails) each test rather than the whole run.
helm: Any = None
kubernetes_validate: Any = None

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "deepinfer"
EXAMPLES = {path.stem: path for path in sorted((CHART / "examples").glob("*.yaml"))}
RELEASE, NAMESPACE = "test", "llm"
GPU = "nvidia.com/gpu"
# Custom resources: no schema in kubernetes-validate; check_custom_resource checks their required fields instead.
CRD_KINDS = {"ServiceMonitor": "monitoring.coreos.com/v1", "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1"}
# The startup probe must let a large model load: at least this many seconds before the first restart.
MIN_STARTUP_BUDGET_S = 30 * 60


# ------------------------------------------------------------------------------------------ the server's flags


def _cli_flags() -> tuple[set[str], set[str]]:
    """(every flag of `deepinfer serve`, the boolean ones, which also have a --no- form), read from the source:
    the server flags (cli.py), the flags engine_args.py adds by name, and one a field of EngineConfig (config.py)."""
    flags: set[str] = set()
    booleans: set[str] = set()
    for source in ("server/cli.py", "engine_args.py", "server/vllm_flags.py"):
        tree = ast.parse((REPO / "python" / "deepinfer" / source).read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                     and a.value.startswith("--")]
            flags.update(names)
            if any(k.arg == "action" and ast.unparse(k.value).endswith("BooleanOptionalAction") for k in node.keywords):
                booleans.update(names)
    config = ast.parse((REPO / "python" / "deepinfer" / "config.py").read_text())
    engine_config = next(n for n in config.body if isinstance(n, ast.ClassDef) and n.name == "EngineConfig")
    for field in engine_config.body:
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
            name = field.target.id
            names = ["--model", "--model-name-or-path"] if name == "model_name_or_path" else \
                ["--" + name.replace("_", "-")]
            flags.update(names)
            if ast.unparse(field.annotation) == "bool":  # engine_args: a non-nullable bool is BooleanOptionalAction
                booleans.update(names)
    for flag in list(booleans):
        flags.add("--no-" + flag[2:])
    assert {"--model", "--tensor-parallel-size", "--api-key", "--port", "--host"} <= flags, "the CLI was not read"
    return flags, booleans


CLI_FLAGS, CLI_BOOLEAN_FLAGS = _cli_flags()


def _chart_engine_options() -> dict[str, str]:
    """The chart's table of engine keys and their flags (deepinfer.engineOptions in _helpers.tpl)."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    body = re.search(r'define "deepinfer\.engineOptions" -}}\n(.*?)\n\{\{- end', text, re.S)
    assert body, "deepinfer.engineOptions not found in _helpers.tpl"
    return dict(line.split() for line in body.group(1).splitlines())


# ------------------------------------------------------------------------------------------ rendering


@pytest.fixture(scope="module", autouse=True)
def _tools():
    global helm, kubernetes_validate
    helm = require_module("helm_python")
    kubernetes_validate = require_module("kubernetes_validate")


@pytest.fixture(scope="module")
def chart(_tools):
    try:
        loaded = helm.Chart.load(str(CHART))
    except OSError as e:  # the wheel's native library does not load on this platform
        skip_or_fail(f"helm-python-sdk cannot load Helm's library here: {e}")
    with loaded as c:
        yield c


def values_of(example: str | None) -> dict[str, Any]:
    return yaml.safe_load(EXAMPLES[example].read_text()) if example else {}


def render(chart, values: dict[str, Any] | None) -> tuple[list[dict[str, Any]], str]:
    """The manifests (parsed) and NOTES.txt."""
    out = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs, notes = [], ""
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs, notes


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[d['kind'] for d in docs]}"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """role (server, leader, worker) -> pod template of the workload."""
    for d in docs:
        if d["kind"] == "Deployment":
            return {"server": d["spec"]["template"]}
        if d["kind"] == "LeaderWorkerSet":
            t = d["spec"]["leaderWorkerTemplate"]
            return {"leader": t["leaderTemplate"], "worker": t["workerTemplate"]}
    raise AssertionError(f"no Deployment or LeaderWorkerSet in {[d['kind'] for d in docs]}")


def container(template: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in template["spec"]["containers"] if c["name"] == "deepinfer"]
    return c


def parse_args(args: list[str]) -> dict[str, list[str]]:
    """--flag -> the words after it up to the next flag (a flag given twice is an error in the chart)."""
    out: dict[str, list[str]] = {}
    current = None
    for word in args:
        if word.startswith("--"):
            assert word not in out, f"{word} appears twice in {args}"
            out[word] = []
            current = word
        else:
            assert current is not None, f"{word!r} before any flag in {args}"
            out[current].append(word)
    return out


def merged_engine(values: dict[str, Any]) -> dict[str, Any]:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["engine"]
    return {**defaults, **values.get("engine", {})}


# ------------------------------------------------------------------------------------------ validation


def check_custom_resource(doc: dict[str, Any]) -> None:
    """The required fields of the two CRD kinds (kubernetes-validate has no schemas for custom resources)."""
    kind = doc["kind"]
    assert doc["apiVersion"] == CRD_KINDS[kind], doc["apiVersion"]
    assert doc["metadata"]["name"] and doc["metadata"]["namespace"]
    spec = doc["spec"]
    if kind == "ServiceMonitor":
        assert spec["selector"]["matchLabels"], "a ServiceMonitor selects Services by label"
        assert spec["endpoints"], "a ServiceMonitor needs an endpoint"
        for endpoint in spec["endpoints"]:
            assert isinstance(endpoint["port"], str) and endpoint["path"] == "/metrics"
            assert endpoint.get("scheme", "http") in ("http", "https")
    else:  # LeaderWorkerSet
        assert isinstance(spec["replicas"], int) and spec["replicas"] >= 0
        assert spec["startupPolicy"] in ("LeaderCreated", "LeaderReady")
        template = spec["leaderWorkerTemplate"]
        assert isinstance(template["size"], int) and template["size"] >= 1
        assert template["restartPolicy"] in ("RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None")
        for role in ("leaderTemplate", "workerTemplate"):  # workerTemplate is the required one
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"check-{role}"},
                            "template": template[role]}
            validate_core(pod_template)


def kube_versions() -> tuple[str, str]:
    """The oldest Kubernetes the chart allows (Chart.yaml's kubeVersion) and the newest the schemas know."""
    floor = re.match(r">=\s*(\d+\.\d+)", yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"])
    return floor.group(1), kubernetes_validate.utils.latest_version()


def validate_core(doc: dict[str, Any]) -> None:
    for version in kube_versions():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            raise AssertionError(f"{doc['kind']} {doc['metadata'].get('name')} is not valid for Kubernetes "
                                 f"{version}: {path}: {e.message}") from None


def validate(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE, doc["kind"]
        if doc["kind"] in CRD_KINDS:
            check_custom_resource(doc)
        else:
            validate_core(doc)


CASES = {
    "defaults": {},
    **{name: values_of(name) for name in EXAMPLES},
    # A Secret the chart creates from a value (the example uses an existing one).
    "api-key-from-value": {"apiKey": {"enabled": True, "value": "sk-test-123"}},
}


def test_examples_are_there():
    assert {"single-gpu-v2-lite", "v3-fp8-8gpu", "api-key-servicemonitor", "multi-node-lws"} <= set(EXAMPLES)


def test_chart_metadata():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert meta["apiVersion"] == "v2" and meta["version"] == "0.1.0"
    assert meta["appVersion"] == version, "appVersion is the deepinfer package's version (pyproject.toml)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_renders_and_validates(chart, case):
    docs, notes = render(chart, CASES[case])
    validate(docs)
    kinds = sorted(d["kind"] for d in docs)
    assert "Service" in kinds and ("Deployment" in kinds) != ("LeaderWorkerSet" in kinds), kinds
    assert f"{RELEASE}-deepinfer" in notes and "/health" in notes


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint(case):
    report = helm.lint(str(CHART), CASES[case], strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    assert not problems, problems


@pytest.mark.parametrize("case", sorted(CASES))
def test_gpus_equal_tensor_parallel_size(chart, case):
    values = CASES[case]
    docs, _ = render(chart, values)
    engine = merged_engine(values)
    nodes = values.get("multiNode", {}).get("size", 1) if values.get("multiNode", {}).get("enabled") else 1
    expected = engine["tensorParallelSize"] // nodes
    for role, template in pod_specs(docs).items():
        resources = container(template)["resources"]
        assert resources["requests"][GPU] == resources["limits"][GPU] == expected, (role, resources)
        args = parse_args(container(template)["args"])
        assert args["--tensor-parallel-size"] == [str(engine["tensorParallelSize"])]
        shm = [v for v in template["spec"].get("volumes", []) if v["name"] == "dshm"]
        if expected > 1:  # NCCL between the pod's GPUs
            assert shm and shm[0]["emptyDir"]["medium"] == "Memory", template["spec"].get("volumes")
            assert {"name": "dshm", "mountPath": "/dev/shm"} in container(template)["volumeMounts"]
        else:
            assert not shm


def test_v3_example_is_eight_gpus_of_fp8():
    engine = values_of("v3-fp8-8gpu")["engine"]
    assert engine["tensorParallelSize"] == 8 and engine["quantization"] == "fp8"


def test_gpu_count_override_and_its_check(chart):
    docs, _ = render(chart, {"gpu": {"count": 2}})
    assert container(pod_specs(docs)["server"])["resources"]["limits"][GPU] == 2
    docs, _ = render(chart, {"gpu": {"count": 0}})  # a CPU-only pod
    assert GPU not in container(pod_specs(docs)["server"]).get("resources", {}).get("limits", {})
    with pytest.raises(helm.HelmError, match="fewer GPUs than the 8 tensor-parallel ranks"):
        render(chart, {"engine": {"tensorParallelSize": 8}, "gpu": {"count": 4}})


@pytest.mark.parametrize("case", sorted(CASES))
def test_probes_on_health(chart, case):
    docs, _ = render(chart, CASES[case])
    for role, template in pod_specs(docs).items():
        c = container(template)
        if role == "worker":  # only node rank 0 serves HTTP
            assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(c), c.keys()
            continue
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] == "/health" and c[probe]["httpGet"]["port"] == "http", c[probe]
        startup = c["startupProbe"]
        budget = startup.get("initialDelaySeconds", 0) + startup["periodSeconds"] * startup["failureThreshold"]
        assert budget >= MIN_STARTUP_BUDGET_S, f"{role}: the model gets {budget}s to load"
        (port,) = [p for p in c["ports"] if p["name"] == "http"]
        assert parse_args(c["args"])["--port"] == [str(port["containerPort"])]
        assert parse_args(c["args"])["--host"] == ["0.0.0.0"], "the server's default 127.0.0.1 is unreachable"


def test_probes_and_scrapes_use_https_with_a_certificate(chart):
    docs, _ = render(chart, {"engine": {"sslCertfile": "/tls/tls.crt", "sslKeyfile": "/tls/tls.key"},
                             "metrics": {"serviceMonitor": {"enabled": True}}})
    c = container(pod_specs(docs)["server"])
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["scheme"] == "https"


@pytest.mark.parametrize("case", sorted(CASES))
def test_non_root(chart, case):
    docs, _ = render(chart, CASES[case])
    for role, template in pod_specs(docs).items():
        pod = template["spec"]["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, (role, pod)
        c = container(template)["securityContext"]
        assert c["runAsNonRoot"] is True and c["allowPrivilegeEscalation"] is False, (role, c)
        assert "ALL" in c["capabilities"]["drop"]


def api_key_env(template: dict[str, Any]) -> dict[str, Any]:
    (env,) = [e for e in container(template)["env"] if e["name"] == "DEEPINFER_API_KEY"]
    return env


def test_api_key_from_an_existing_secret(chart):
    values = values_of("api-key-servicemonitor")
    docs, _ = render(chart, values)
    assert not [d for d in docs if d["kind"] == "Secret"], "an existing Secret is not created again"
    for template in pod_specs(docs).values():
        env = api_key_env(template)
        assert "value" not in env
        assert env["valueFrom"]["secretKeyRef"] == {"name": values["apiKey"]["existingSecret"],
                                                    "key": values["apiKey"]["secretKey"]}
        assert "--api-key" not in container(template)["args"], "the key is never on the command line"


def test_api_key_from_a_value(chart):
    docs, _ = render(chart, CASES["api-key-from-value"])
    secret = one(docs, "Secret")
    assert base64.b64decode(secret["data"]["api-key"]).decode() == "sk-test-123"
    env = api_key_env(pod_specs(docs)["server"])
    assert env["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "api-key"}
    assert "sk-test-123" not in json.dumps(pod_specs(docs))


def test_api_key_needs_a_secret_or_a_value(chart):
    with pytest.raises(helm.HelmError, match="apiKey.enabled needs apiKey.existingSecret"):
        render(chart, {"apiKey": {"enabled": True}})


def test_no_api_key_by_default(chart):
    docs, notes = render(chart, {})
    assert not [e for e in container(pod_specs(docs)["server"]).get("env", []) if e["name"] == "DEEPINFER_API_KEY"]
    assert "No API key" in notes


def expected_words(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return [str(int(value))]
    return [str(value)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_args_carry_the_values_flags(chart, case):
    values = CASES[case]
    docs, _ = render(chart, values)
    options = _chart_engine_options()
    for role, template in pod_specs(docs).items():
        words = container(template)["args"]
        args = parse_args(words)
        unknown = sorted(set(args) - CLI_FLAGS - {"--nnodes", "--node-rank", "--dist-init-addr"})
        assert not unknown, f"{role}: flags `deepinfer serve` does not have: {unknown}"
        for key, value in merged_engine(values).items():
            flag = options[key]
            if value is None or value == "":
                assert flag not in args and "--no-" + flag[2:] not in args, (key, words)
            elif value is True:
                assert args[flag] == [], (key, words)
            elif value is False:
                assert args["--no-" + flag[2:]] == [], (key, words)
            elif isinstance(value, dict):
                assert [json.loads(w) for w in args[flag]] == [value], (key, words)
            else:
                assert args[flag] == expected_words(value), (key, words)
        extra = values.get("extraArgs", [])
        assert words[len(words) - len(extra):] == extra


def test_every_engine_key_renders_a_flag_of_the_cli(chart):
    """Every key of `engine`, set, renders the flag of its name, and that flag is one `deepinfer serve` has; the
    table in _helpers.tpl, values.yaml and values.schema.json name the same keys."""
    options = _chart_engine_options()
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["engine"]
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["engine"]["properties"]
    assert set(options) == set(defaults) == set(schema)
    for key, flag in options.items():
        assert flag in CLI_FLAGS, f"engine.{key} renders {flag}, which `deepinfer serve` does not have"
        assert flag == "--" + re.sub(r"(?<!^)([A-Z])", r"-\1", key).lower(), (key, flag)
    samples: dict[str, Any] = {}
    for key, rule in schema.items():
        types = rule.get("type", [])
        if "enum" in rule:
            samples[key] = next(v for v in rule["enum"] if v is not None)
        elif "boolean" in types:
            samples[key] = True
        elif "integer" in types:
            samples[key] = max(rule.get("minimum", 1), 2) if "maximum" not in rule else rule["maximum"]
        elif "number" in types:
            samples[key] = 0.5
        elif "object" in types:
            samples[key] = {"method": "mtp", "num_speculative_tokens": 1}
        elif "array" in types:
            samples[key] = ["https://a.example", "https://b.example"]
        else:
            samples[key] = "/x" if key == "rootPath" else f"{key}-value"
    docs, _ = render(chart, {"engine": samples, "gpu": {"count": 2}})
    args = parse_args(container(pod_specs(docs)["server"])["args"])
    for key, flag in options.items():
        value = samples[key]
        if value is True:
            assert args[flag] == [] and flag in CLI_BOOLEAN_FLAGS, (key, flag)
        elif isinstance(value, dict):
            assert json.loads(args[flag][0]) == value
        else:
            assert args[flag] == expected_words(value), (key, args.get(flag))
    for key in [k for k, v in samples.items() if v is True]:
        flag = options[key]
        docs, _ = render(chart, {"engine": {key: False}})
        negated = "--no-" + flag[2:]
        assert negated in parse_args(container(pod_specs(docs)["server"])["args"]) and negated in CLI_FLAGS


def test_extra_args_env_and_extra_env(chart):
    values = {"extraArgs": ["--response-role", "bot", "--uvicorn-log-level", "warning"],
              "env": {"DEEPINFER_NO_PROGRESS": "1", "OMP_NUM_THREADS": 8},
              "extraEnv": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]}
    docs, _ = render(chart, values)
    validate(docs)
    c = container(pod_specs(docs)["server"])
    assert c["args"][-4:] == values["extraArgs"]
    env = {e["name"]: e for e in c["env"]}
    assert env["DEEPINFER_NO_PROGRESS"]["value"] == "1" and env["OMP_NUM_THREADS"]["value"] == "8"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    assert env["HF_HOME"]["value"] == yaml.safe_load((CHART / "values.yaml").read_text())["hfCache"]["mountPath"]


def test_model_volumes(chart):
    docs, _ = render(chart, values_of("v3-fp8-8gpu"))
    spec = pod_specs(docs)["server"]["spec"]
    (model,) = [v for v in spec["volumes"] if v["name"] == "model"]
    assert model["hostPath"] == {"path": "/data/models", "type": "Directory"}
    docs, _ = render(chart, values_of("single-gpu-v2-lite"))
    template = pod_specs(docs)["server"]
    (model,) = [v for v in template["spec"]["volumes"] if v["name"] == "model"]
    assert model["persistentVolumeClaim"]["claimName"] == "deepseek-models"
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container(template)["volumeMounts"]
    assert parse_args(container(template)["args"])["--model"][0].startswith("/models/")
    with pytest.raises(helm.HelmError, match="modelStorage.type pvc needs modelStorage.claimName"):
        render(chart, {"modelStorage": {"type": "pvc"}})


def test_metrics_service_monitor_or_annotations(chart):
    docs, _ = render(chart, values_of("api-key-servicemonitor"))
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items(), "the ServiceMonitor selects the Service"
    assert monitor["spec"]["endpoints"][0]["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert not {k for k in pod_specs(docs)["server"]["metadata"].get("annotations", {}) if k.startswith("prometheus.io")}

    docs, _ = render(chart, {})
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    annotations = pod_specs(docs)["server"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert annotations["prometheus.io/port"] == "8000"


def test_service_selects_the_serving_pods(chart):
    for case in ("defaults", "multi-node-lws"):
        docs, _ = render(chart, CASES[case])
        selector = one(docs, "Service")["spec"]["selector"]
        serving = [t for role, t in pod_specs(docs).items() if role != "worker"]
        assert len(serving) == 1 and selector.items() <= serving[0]["metadata"]["labels"].items(), case
        for role, template in pod_specs(docs).items():
            if role == "worker":
                assert not selector.items() <= template["metadata"]["labels"].items()


def test_multi_node_wires_the_lws_variables(chart):
    values = values_of("multi-node-lws")
    docs, notes = render(chart, values)
    assert not [d for d in docs if d["kind"] == "Deployment"]
    lws = one(docs, "LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == values["multiNode"]["size"]
    # LWS creates a headless Service named as the LeaderWorkerSet: it must not be the chart's Service's name.
    assert lws["metadata"]["name"] != one(docs, "Service")["metadata"]["name"]
    for role, template in pod_specs(docs).items():
        args = parse_args(container(template)["args"])
        assert args["--nnodes"] == ["$(LWS_GROUP_SIZE)"], role
        assert args["--node-rank"] == ["$(LWS_WORKER_INDEX)"], role
        assert args["--dist-init-addr"] == [f"$(LWS_LEADER_ADDRESS):{values['multiNode']['distInitPort']}"], role
    assert "The leader pod of each group serves" in notes
    with pytest.raises(helm.HelmError, match="not a multiple of multiNode.size"):
        render(chart, {**values, "engine": {**values["engine"], "tensorParallelSize": 12}, "multiNode":
                       {**values["multiNode"], "size": 5}})


def test_the_multi_node_flags_are_the_engines():
    """What the pods are started with is the serve command's own launch flags (test_parallel.py runs them)."""
    assert {"--nnodes", "--node-rank", "--dist-init-addr"} <= CLI_FLAGS


def test_schema_refuses_unknown_and_wrong_values(chart):
    with pytest.raises(helm.HelmValuesError, match="tensorParalelSize"):
        render(chart, {"engine": {"tensorParalelSize": 8}})
    with pytest.raises(helm.HelmValuesError):
        render(chart, {"engine": {"kvCacheDtype": "int8"}})
    with pytest.raises(helm.HelmValuesError):
        render(chart, {"engine": {"gpuMemoryUtilization": 1.5}})
    for example, path in EXAMPLES.items():  # the examples as written, through the chart's schema
        chart.validate_schema(yaml.safe_load(path.read_text()))


def test_the_pods_run_as_the_images_user():
    """The chart's default uid is the one the image creates and gives its HF_HOME volume (deploy/docker/Dockerfile):
    another uid could not write the cache."""
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\d+):(\d+)\s*$", dockerfile, flags=re.M)
    assert users, "the Dockerfile's final USER is not numeric uid:gid"
    uid, gid = map(int, users[-1])
    context = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (uid, gid, gid)
