"""The package's dependencies are compatible ranges (an exact pin in a package clashes with a user's environment),
and the versions the test suite is pinned to (requirements-*.txt) lie inside them: what CI runs is what users get."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def package_requirements() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project.get("optional-dependencies", {})}
    return {group: [Requirement(r) for r in reqs] for group, reqs in groups.items()}


def pinned_versions() -> dict[str, str]:
    pins: dict[str, str] = {}
    for path in sorted(ROOT.glob("requirements-*.txt")):
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                req = Requirement(line)
                (spec,) = req.specifier  # one exact pin a line
                assert spec.operator == "==", f"{path.name}: {line!r} is not an exact pin"
                pins[canonical(req.name)] = spec.version
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_package_pins_nothing_exactly():
    for group, reqs in package_requirements().items():
        for req in reqs:
            assert req.specifier, f"[{group}] {req}: give a compatible range"
            assert all(s.operator not in ("==", "===") for s in req.specifier), \
                f"[{group}] {req}: an exact pin belongs in a requirements file, the package takes a range"


def test_the_pinned_test_versions_satisfy_the_package_ranges():
    pins = pinned_versions()
    for group, reqs in package_requirements().items():
        for req in reqs:
            name = canonical(req.name)
            assert name in pins, f"[{group}] {req.name} is not pinned in any requirements-*.txt"
            assert req.specifier.contains(pins[name], prereleases=True), \
                f"[{group}] {req}: the pinned {pins[name]} is outside the range"
