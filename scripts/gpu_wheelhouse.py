"""Build the wheelhouse the GPU machine installs offline: the distributions lit-agentrl needs that it lacks.

The GPU machine lent to this project (``scripts/gpu_machine.txt``) has Python 3.12 with torch 2.11, Lightning 2.6.6,
transformers 5.17.0 and torchmetrics 1.9.0, no SGLang, and no package registry; a run brings at most 64 MiB with it.
This walks the requirements of the project and of the GPU checks (``pyproject.toml``'s dependencies, the pytest
plugins the tests use) through the metadata of the distributions installed here, stops at what the machine holds,
pins each distribution left to the version installed here (the versions the project is tested with), and downloads
its wheel for the machine's Python and platform. ``scripts/gpu_checks.sh`` installs them with
``pip install --no-index --find-links wheelhouse -r wheelhouse/requirements.txt`` (torch and the rest stay as they are).

    python scripts/gpu_wheelhouse.py [--out wheelhouse] [--python-version 3.12] [--machine PYTHON_OR_LIST]

Prints each wheel and the total size; exits 1 when the total passes the limit (64 MiB) or a wheel cannot be had.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path
from typing import cast

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[1]
MACHINE = Path(__file__).with_name("gpu_machine.txt")
CHECK_PLUGINS = ["pytest-timeout", "pytest-asyncio"]  # what tests/ needs beyond pytest, which the machine has
LIMIT_BYTES = 64 << 20


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in [*project["dependencies"], *CHECK_PLUGINS]]


def machine_distributions(source: Path = MACHINE) -> set[str]:
    """What the machine holds. From a Python of an environment like it (``scripts/build_gpu_machine_env.sh``), all it
    has installed; from a list of requirements (``scripts/gpu_machine.txt``), the distributions it names and, through
    the metadata installed here, what they require (which differs from the machine's where versions differ)."""
    if source.suffix != ".txt":
        done = subprocess.run([str(source), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"gpu_wheelhouse: {source} -m pip list failed:\n{done.stderr[-2000:]}")
        return {canonicalize_name(line.split("==")[0]) for line in done.stdout.splitlines() if "==" in line}
    names = [line.split("#")[0].split("==")[0].strip() for line in source.read_text().splitlines()]
    return closure([Requirement(name) for name in names if name], stop=set())


def closure(requirements: list[Requirement], stop: set[str], python_version: str | None = None) -> set[str]:
    """The canonical names of ``requirements`` and everything they require (markers evaluated for
    ``python_version``), walked through the metadata installed here, not walking into ``stop``."""
    environment = dict(cast("dict[str, str]", default_environment()))  # a TypedDict, extended below
    if python_version is not None:
        environment |= {"python_version": python_version, "python_full_version": f"{python_version}.0"}
    found: set[str] = set()
    pending = list(requirements)
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in found or name in stop:
            continue
        found.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: its requirements are the machine's (or pip's) to resolve
        for text in requires:
            child = Requirement(text)
            extras = requirement.extras or {""}
            if child.marker is None or any(child.marker.evaluate({**environment, "extra": e}) for e in extras):
                pending.append(child)
    return found


def needed(python_version: str, machine: Path = MACHINE) -> dict[str, str]:
    """Name -> the version installed here, of each distribution the project needs that the machine lacks."""
    have = machine_distributions(machine)
    names = closure(project_requirements(), stop=have, python_version=python_version)
    missing = sorted(name for name in names if _installed_version(name) is None)
    if missing:
        raise SystemExit(
            f"gpu_wheelhouse: not installed here, so no version to pin: {missing} (pip install -e .[test])"
        )
    return {name: str(_installed_version(name)) for name in sorted(names)}


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def download(pins: dict[str, str], out: Path, python_version: str, platform: str) -> None:
    """Each pinned wheel for the machine's Python and platform, without dependencies (the walk found them)."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", scratch,
            "--python-version", python_version, "--platform", platform, "--platform", "manylinux2014_x86_64",
            *(f"{name}=={version}" for name, version in pins.items()),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"gpu_wheelhouse: pip download failed:\n{done.stderr[-3000:]}")
        out.mkdir(parents=True, exist_ok=True)
        for wheel in Path(scratch).glob("*.whl"):
            wheel.replace(out / wheel.name)
    (out / "requirements.txt").write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "wheelhouse", help="the folder (default: wheelhouse/)")
    parser.add_argument("--python-version", default="3.12", help="the machine's Python (default: 3.12)")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="its wheel platform")
    parser.add_argument(
        "--machine", type=Path, default=MACHINE,
        help="what the machine holds: a requirements list (default: scripts/gpu_machine.txt) or the python of an "
        "environment like it (PY=$(scripts/build_gpu_machine_env.sh); closer where versions differ)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    pins = needed(args.python_version, args.machine)
    download(pins, args.out, args.python_version, args.platform)
    wheels = sorted(args.out.glob("*.whl"))
    total = sum(wheel.stat().st_size for wheel in wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{total / 2**20:7.2f} MiB  in all, {len(wheels)} wheels ({args.out}); the limit is {LIMIT_BYTES >> 20} MiB")
    return 0 if total <= LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
