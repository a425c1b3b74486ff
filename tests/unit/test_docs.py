"""The docs hold: the README stays short, every relative link and anchor resolves, and every
`vidpoll` command and flag that the README, docs/ and the deployment examples use exists in
the real CLI (`vidpoll.cli.main`, walked as a click group: no subprocess).

The examples under docs/deploy/ are parsed and checked here (Kubernetes YAML, systemd units,
the Dockerfile, environment files, PgBouncer's ini), never run: no container runtime, cluster
or systemd runs where the tests do. `systemd-analyze verify`, where it exists, checks the
units' syntax offline.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from vidpoll.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DEPLOY = DOCS / "deploy"
README = ROOT / "README.md"
README_MAX_LINES = 200
MARKDOWN = sorted([*ROOT.glob("*.md"), *DOCS.rglob("*.md")])

FENCE = re.compile(r"^(```|~~~)([^\n]*)\n(.*?)^\1[ \t]*$", re.M | re.S)
SHELL_LANGS = {"sh", "bash", "shell", "console"}
SEPARATORS = {"|", "||", "&&", ";", "&"}
WRAPPERS = {"sudo", "env", "exec", "time", "nohup", "command"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
COMMAND_NAME = re.compile(r"[a-z][a-z0-9-]*")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
# variables vidpoll reads for one account: SUME_API_KEY_<NAME>, VIDPOLL_..._RATE_PER_MIN_<NAME>
PER_ACCOUNT = re.compile(r"(SUME_API_KEY|VIDPOLL_STATUS_RATE_PER_MIN|VIDPOLL_SUBMIT_RATE_PER_MIN)"
                         r"_[A-Z0-9_]+")
NOT_VIDPOLLS = {"PYTHONUNBUFFERED"}  # the image's own setting


# -- the CLI ----------------------------------------------------------------------------------

def option_of(cmd: click.Command, name: str) -> click.Option | None:
    """The option `name` (`--flag` or `-f`, either side of a `--x/--no-x` pair) of `cmd`."""
    if name == "--help":
        return click.Option(["--help"], is_flag=True)
    for param in cmd.params:
        if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def default_of(cmd: click.Command, name: str) -> Any:
    option = option_of(cmd, name)
    assert option is not None, f"the CLI has no {name}"
    return option.default


WORKER = main.commands["worker"]
SERVE = main.commands["serve"]
SHUTDOWN_TIMEOUT_S = float(default_of(WORKER, "--shutdown-timeout"))


@dataclass
class Invocation:
    """One `vidpoll ...` command line found in a file: what it ran and what was wrong."""

    where: str
    argv: list[str]
    path: list[str] = field(default_factory=list)
    options: dict[str, str | None] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        return " ".join(self.path)


def check_invocation(where: str, argv: list[str]) -> Invocation:
    """Walk `argv` (what follows `vidpoll`) through the click group: every subcommand must exist
    and every --flag must belong to the command it follows. Synopsis brackets are ignored;
    an upper-case or <placeholder> word where a command is expected ends the walk."""
    inv = Invocation(where, argv)
    cmd: click.Command = main
    i = 0
    while i < len(argv):
        raw = argv[i]
        token = raw.strip("[]")
        i += 1
        if raw in SEPARATORS:
            break
        if token.startswith("-") and len(token) > 1 and not token.lstrip("-").isdigit():
            name, eq, value = token.partition("=")
            option = option_of(cmd, name)
            if option is None:
                inv.errors.append(f"{where}: `vidpoll {' '.join(argv)}`: "
                                  f"`{' '.join(['vidpoll', *inv.path])}` has no option {name}")
                continue
            takes_value = not (option.is_flag or option.count)
            if takes_value and not eq and i < len(argv):
                value = argv[i].strip("[]")
                i += 1
            inv.options[name] = value if takes_value else None
            continue
        if isinstance(cmd, click.Group):
            if not COMMAND_NAME.fullmatch(token):
                break  # COMMAND, <placeholder>, …: nothing more to check
            sub = cmd.commands.get(token)
            if sub is None:
                inv.errors.append(f"{where}: `vidpoll {' '.join(argv)}`: "
                                  f"`{' '.join(['vidpoll', *inv.path])}` has no command {token}")
                break
            cmd = sub
            inv.path.append(token)
        # else: an argument or an option's value in a synopsis: nothing to check
    return inv


def invocations_in_tokens(where: str, tokens: list[str]) -> Iterator[Invocation]:
    """Each `vidpoll` in command position (line start, after a separator, an assignment or a
    wrapper such as sudo) with its arguments up to the next separator. `sh -c SCRIPT` is
    looked into."""
    start = True
    for i, token in enumerate(tokens):
        if token in SEPARATORS:
            start = True
            continue
        if not start:
            continue
        if ASSIGNMENT.fullmatch(token) or token in WRAPPERS:
            continue
        start = False
        name = Path(token).name
        rest = tokens[i + 1:]
        end = next((j for j, t in enumerate(rest) if t in SEPARATORS), len(rest))
        if name == "vidpoll":
            yield check_invocation(where, rest[:end])
        elif name in ("sh", "bash") and rest[:1] == ["-c"] and len(rest) > 1:
            yield from invocations_in_tokens(where, shlex.split(rest[1], comments=True))


def shell_lines(block: str) -> Iterator[str]:
    """Logical lines of a shell block: `\\` continuations joined, and a synopsis line that
    goes on indented (`    [--flag ...]`) joined to the line above."""
    lines: list[str] = []
    for raw in block.splitlines():
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + raw.strip()
        elif lines and raw[:1].isspace() and raw.strip()[:1] in ("[", "-"):
            lines[-1] += " " + raw.strip()
        else:
            lines.append(raw)
    yield from lines


def fenced_blocks(text: str) -> Iterator[tuple[str, str]]:
    """(language, body) of each fenced code block."""
    for match in FENCE.finditer(text):
        yield match.group(2).strip().split(" ")[0].lower(), match.group(3)


def without_code(text: str) -> str:
    """Markdown with its fenced blocks and inline code blanked (links there are not links)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub("``", text)


def markdown_invocations(path: Path) -> list[Invocation]:
    """Every `vidpoll ...` in the file's shell blocks, and in its inline code spans."""
    where = str(path.relative_to(ROOT))
    text = path.read_text(encoding="utf-8")
    found: list[Invocation] = []
    for lang, body in fenced_blocks(text):
        if lang not in SHELL_LANGS:
            continue
        for n, line in enumerate(shell_lines(body), 1):
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as exc:
                raise AssertionError(f"{where}: a shell line does not parse ({exc}): "
                                     f"{line!r}") from None
            found += invocations_in_tokens(f"{where} (shell block line {n})", tokens)
    prose = FENCE.sub("", text)
    for match in INLINE_CODE.finditer(prose):
        span = match.group(2).strip()
        if not span.startswith("vidpoll "):
            continue
        try:
            tokens = shlex.split(span, comments=True)
        except ValueError:
            tokens = span.split()
        found += invocations_in_tokens(f"{where} (`{span}`)", tokens)
    return found


def errors_of(invocations: list[Invocation]) -> list[str]:
    return [e for inv in invocations for e in inv.errors]


# -- the README and the docs -------------------------------------------------------------------

def test_the_readme_is_under_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; the reference goes to docs/"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_vidpoll_command_in_the_docs_exists(path: Path) -> None:
    assert not errors_of(markdown_invocations(path))


def test_the_readme_walkthrough_and_the_command_list_are_checked() -> None:
    """The extraction finds what it must (a broken pattern would pass every file vacuously)."""
    readme = {inv.command for inv in markdown_invocations(README)}
    for command in ("migrate", "fake-sume", "worker", "submit", "jobs add", "jobs list",
                    "jobs show", "doctor", "serve"):
        assert command in readme, f"the README's walkthrough runs no `vidpoll {command}`"
    listed = {inv.command for inv in markdown_invocations(DOCS / "COMMANDS.md")}

    def leaves(group: click.Group, prefix: list[str]) -> Iterator[str]:
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from leaves(cmd, [*prefix, name])
            else:
                yield " ".join([*prefix, name])

    missing = sorted(set(leaves(main, [])) - listed)
    assert not missing, f"docs/COMMANDS.md lists no `vidpoll {missing[0]}` (nor {missing[1:]})"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, re.M):
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for target in LINK.findall(without_code(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:: not checked (no network here)
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: {resolved.name} has no heading #{anchor}")
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"


# -- docs/deploy: what each example may contain ---------------------------------------------

def deploy_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file())


def known_variables() -> set[str]:
    """Every environment variable named in vidpoll's source."""
    names: set[str] = set()
    for source in (ROOT / "src" / "vidpoll").rglob("*.py"):
        names.update(re.findall(r"\b(DATABASE_URL|SUME_[A-Z0-9_]+|VIDPOLL_[A-Z0-9_]+)\b",
                                source.read_text(encoding="utf-8")))
    return names


KNOWN_VARIABLES = known_variables()


def unknown_variables(names: list[str]) -> list[str]:
    return [n for n in names if n not in KNOWN_VARIABLES and n not in NOT_VIDPOLLS
            and not PER_ACCOUNT.fullmatch(n)]


def test_every_example_file_is_one_the_tests_check() -> None:
    kinds = (".yaml", ".service", ".example", ".ini")
    unchecked = [p for p in deploy_files() if p.name != "Dockerfile" and p.suffix not in kinds]
    assert deploy_files(), "docs/deploy/ is empty"
    assert not unchecked, f"no test checks {unchecked}: teach tests/unit/test_docs.py"


def seconds(value: str) -> float:
    """A systemd time span: `40`, `40s`, `1min 30s`, `1h`."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts, f"not a time span: {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def systemd_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections → keys → values (a key may repeat, as Environment= does)."""
    unit: dict[str, dict[str, list[str]]] = {}
    section = None
    lines = iter(path.read_text(encoding="utf-8").splitlines())
    for raw in lines:
        line = raw.strip()
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines).strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.setdefault(section, {})
            continue
        assert section is not None, f"{path.name}: {line!r} is outside any section"
        key, eq, value = line.partition("=")
        assert eq, f"{path.name}: {line!r} is not key=value"
        unit[section].setdefault(key.strip(), []).append(value.strip())
    return unit


UNITS = sorted(DEPLOY.rglob("*.service"))


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_units(path: Path) -> None:
    unit = systemd_unit(path)
    assert {"Unit", "Service"} <= set(unit), f"{path.name}: sections {sorted(unit)}"
    service = unit["Service"]
    [exec_start] = service["ExecStart"]
    found = list(invocations_in_tokens(path.name, shlex.split(exec_start.lstrip("-@+!:"))))
    assert len(found) == 1, f"{path.name}: ExecStart runs no vidpoll: {exec_start!r}"
    [inv] = found
    assert not inv.errors
    variables = [v.partition("=")[0] for v in service.get("Environment", [])]
    assert not unknown_variables(variables), f"{path.name}: vidpoll reads no {variables}"
    for env_file in service.get("EnvironmentFile", []):
        example = path.parent / (Path(env_file.lstrip("-")).name + ".example")
        assert example.exists(), f"{path.name}: {env_file} has no example {example.name}"
    if inv.command == "worker":
        timeout = float(inv.options.get("--shutdown-timeout") or SHUTDOWN_TIMEOUT_S)
        assert service.get("KillSignal", ["SIGTERM"]) == ["SIGTERM"]
        stop = seconds(service.get("TimeoutStopSec", ["90"])[0])
        assert stop > timeout, (f"{path.name}: TimeoutStopSec={stop:g} must be above the "
                                f"worker's --shutdown-timeout {timeout:g}")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_accepts_the_units(tmp_path: Path) -> None:
    """systemd's own offline check, with the units' /opt/vidpoll/bin/vidpoll pointed at the
    vidpoll of this environment (verify wants the executable to exist)."""
    vidpoll = Path(sys.executable).with_name("vidpoll")
    assert vidpoll.exists(), f"no {vidpoll}"
    copies = []
    for unit in UNITS:
        text = unit.read_text(encoding="utf-8").replace("/opt/vidpoll/bin/vidpoll", str(vidpoll))
        (tmp_path / unit.name).write_text(text, encoding="utf-8")
        copies.append(f"./{unit.name}")
    done = subprocess.run(["systemd-analyze", "verify", *copies], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    # it exits 0 on a directive it ignores: its complaints name the unit (and the line)
    complaints = [line for line in done.stderr.splitlines()
                  if re.search(r"\.service(:\d+)?: ", line)]
    assert done.returncode == 0 and not complaints, done.stderr


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.example")), ids=lambda p: p.name)
def test_environment_files_set_only_what_vidpoll_reads(path: Path) -> None:
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assert ASSIGNMENT.fullmatch(line), f"{path.name}: {line!r} is not VARIABLE=value"
        names.append(line.partition("=")[0])
    assert names and not unknown_variables(names), f"{path.name}: {unknown_variables(names)}"


def test_the_dockerfile_runs_vidpoll() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    commands = re.findall(r"^(CMD|ENTRYPOINT)\s+(\[.*\])\s*$", text, re.M)
    assert commands, "the Dockerfile has no CMD/ENTRYPOINT in exec form"
    for _, argv in commands:
        found = list(invocations_in_tokens("Dockerfile", json.loads(argv)))
        assert found and not errors_of(found), argv
    names = [n for env in re.findall(r"^ENV\s+(.*)$", text, re.M)
             for n in re.findall(r"([A-Z_][A-Z0-9_]*)=", env)]
    assert not unknown_variables(names), names


def test_the_pgbouncer_example_pools_transactions() -> None:
    ini = configparser.ConfigParser()
    ini.read(DEPLOY / "pgbouncer.ini", encoding="utf-8")
    assert ini["pgbouncer"]["pool_mode"] == "transaction"
    assert "vidpoll" in ini["databases"]


# -- Kubernetes ------------------------------------------------------------------------------

MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))


def documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in MANIFESTS
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return spec["template"]["spec"]
    if doc["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    return None


def secret_keys() -> set[tuple[str, str]]:
    return {(doc["metadata"]["name"], key) for _, doc in documents() if doc["kind"] == "Secret"
            for key in {**doc.get("stringData", {}), **doc.get("data", {})}}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifests_parse(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    assert docs
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert doc["metadata"].get("name")


def containers() -> list[Any]:
    return [pytest.param(where, spec, c, id=where)
            for path, doc in documents() if (spec := pod_spec(doc)) is not None
            for c in spec["containers"]
            if (where := f"{path.name} {doc['kind']}/{doc['metadata']['name']}/{c['name']}")]


@pytest.mark.parametrize(("where", "spec", "container"), containers())
def test_containers(where: str, spec: dict[str, Any], container: dict[str, Any]) -> None:
    argv = [str(a) for a in [*container.get("command", []), *container.get("args", [])]]
    found = list(invocations_in_tokens(where, argv))
    assert len(found) == 1, f"{where}: runs no vidpoll command: {argv}"
    [inv] = found
    assert not inv.errors
    env = container.get("env", [])
    assert not unknown_variables([e["name"] for e in env]), where
    secrets = secret_keys()
    for e in env:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert (ref["name"], ref["key"]) in secrets, f"{where}: no Secret holds {ref}"
    if inv.command == "worker":
        timeout = float(inv.options.get("--shutdown-timeout") or SHUTDOWN_TIMEOUT_S)
        grace = spec.get("terminationGracePeriodSeconds", 30)
        assert grace > timeout, (f"{where}: terminationGracePeriodSeconds {grace} must be "
                                 f"above the worker's --shutdown-timeout {timeout:g}")
    probes = [container[k] for k in ("livenessProbe", "readinessProbe", "startupProbe")
              if k in container]
    if inv.command in ("worker", "serve"):
        assert probes, f"{where}: no probes"
    if not probes:
        return
    if inv.command == "worker":
        port = inv.options.get("--metrics-port")
        host = inv.options.get("--metrics-host") or default_of(WORKER, "--metrics-host")
    else:
        assert inv.command == "serve", f"{where}: probes on `vidpoll {inv.command}`"
        port = inv.options.get("--port") or str(default_of(SERVE, "--port"))
        host = inv.options.get("--host") or default_of(SERVE, "--host")
    assert port is not None, f"{where}: probes, but no --metrics-port"
    assert host not in ("127.0.0.1", "localhost", "::1"), f"{where}: probes cannot reach {host}"
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    for probe in probes:
        get = probe["httpGet"]
        assert get["path"] in ("/healthz", "/readyz"), f"{where}: vidpoll serves no {get['path']}"
        number = ports.get(get["port"], get["port"])
        assert str(number) == str(port), f"{where}: probe on {number}, vidpoll on {port}"
