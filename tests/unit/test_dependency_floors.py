"""The declared dependency ranges admit no version with a known advisory (issue 18)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# the newest version with a known advisory, and the advisory
VULNERABLE = {
    "aiohttp": ("3.14.2", "GHSA-cq5v-8q36-5273: heap read in the C response parser"),
    "jinja2": ("3.1.5", "CVE-2025-27516: sandbox escape through |attr"),
}


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    return {(req := Requirement(line)).name.lower(): req for line in project["dependencies"]}


@pytest.mark.parametrize("name", sorted(VULNERABLE))
def test_no_version_with_a_known_advisory_is_allowed(name: str) -> None:
    version, advisory = VULNERABLE[name]
    req = _declared()[name]
    assert not req.specifier.contains(version, prereleases=True), (
        f"{name}{req.specifier} allows {version} ({advisory})")
