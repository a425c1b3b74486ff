"""Start-up CPU of the `vidpoll` command (issue 19): each command N times in a fresh process,
the median and the max of its CPU seconds (user + sys, from os.wait4), and which heavy
modules it loaded (aiohttp, psycopg, rich, the fake provider, ...: its sys.modules at exit).

    make bench-startup
    .venv/bin/python bench/startup.py --src /tmp/base-cli/src --src src   # before | after

Each --src is a source tree put first on PYTHONPATH (a copy of another commit: `git archive
COMMIT | tar -x -C DIR`), so trees are measured side by side in one run, on one database and
one machine's load. Commands: `vidpoll --help`, `vidpoll submit --help`, `vidpoll jobs list
--help`, and a real `vidpoll submit --prompt ...` that records one intent in a scratch
database (DATABASE_URL's server, else the embedded one; migrated by that tree's own `vidpoll
migrate`) and tries it once against a closed port (it stays queued: exit 0).

Bytecode is cached, as an installed wheel's is (a fresh PYTHONPYCACHEPREFIX, one warm-up run
per command not counted); --cold compiles vidpoll's sources on every run instead
(PYTHONDONTWRITEBYTECODE=1, as this repository's dev shell sets it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from scratch_db import scratch_database

ROOT = Path(__file__).resolve().parents[1]
VIDPOLL = Path(sys.executable).with_name("vidpoll")  # the console script pip installed
HEAVY = ("aiohttp", "psycopg", "psycopg_pool", "rich", "prometheus_client", "jinja2",
         "platformdirs", "vidpoll.api", "vidpoll.store", "vidpoll.providers.sume.fake")
"""Modules worth naming when a command loads them (each with its submodules)."""
COMMANDS: dict[str, list[str]] = {
    "--help": ["--help"],
    "submit --help": ["submit", "--help"],
    "jobs list --help": ["jobs", "list", "--help"],
    "submit": ["submit", "--prompt", "a heron at dawn"],
}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(src: Path, db_url: str, pycache: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SUME_", "VIDPOLL_", "PYTHON"))}
    env.update(PYTHONPATH=str(src), DATABASE_URL=db_url, SUME_API_KEY="sk-bench",
               SUME_BASE_URL=f"http://127.0.0.1:{closed_port()}", VIDPOLL_HTTP_TIMEOUT="5")
    if pycache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Run `vidpoll argv`; its CPU seconds (user + sys) and its stderr. Exit 0 or raise."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, str(VIDPOLL), *argv], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"vidpoll {' '.join(argv)} exited {proc.returncode}:\n{stderr}")
    return usage.ru_utime + usage.ru_stime, stderr


# runs the console script as python would, then writes the names in sys.modules to a file
# (`-X importtime` would miss modules loaded through importlib.import_module: lazy ones)
MODULES_AT_EXIT = """import atexit, pathlib, runpy, sys
out = pathlib.Path(sys.argv.pop(1))
atexit.register(lambda: out.write_text("\\n".join(sys.modules)))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def heavy_modules(argv: list[str], env: dict[str, str]) -> list[str]:
    """The HEAVY modules `vidpoll argv` has loaded when it exits (one extra run)."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        proc = subprocess.run([sys.executable, "-c", MODULES_AT_EXIT, out.name, str(VIDPOLL),
                               *argv], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"vidpoll {' '.join(argv)} exited {proc.returncode}:\n"
                             f"{proc.stderr}")
        loaded = set(out.read().split())
    return [h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in loaded)]


@contextmanager
def migrated_database(src: Path, pycache: Path | None) -> Iterator[str]:
    """A scratch database with the schema of the tree in `src` (its own `vidpoll migrate`)."""
    with scratch_database() as url:
        run_once(["migrate"], child_env(src, url, pycache))
        yield url


def measure(srcs: list[Path], runs: int, cold: bool) -> list[dict[str, Any]]:
    results = []
    with ExitStack() as stack:
        pycache = None if cold else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="vidpoll-pycache-")))
        urls = {src: stack.enter_context(migrated_database(src, pycache)) for src in srcs}
        for name, argv in COMMANDS.items():
            for src in srcs:
                env = child_env(src, urls[src], pycache)
                run_once(argv, env)  # warm-up: bytecode written (not counted)
                cpu = [run_once(argv, env)[0] for _ in range(runs)]
                results.append({"command": f"vidpoll {name}", "src": str(src), "runs": runs,
                                "median_cpu_s": round(statistics.median(cpu), 3),
                                "max_cpu_s": round(max(cpu), 3),
                                "heavy_modules": heavy_modules(argv, env),
                                "bytecode": "compiled every run" if cold else "cached"})
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", action="append", type=Path,
                   help="A source tree to measure (repeatable) [default: this checkout's src].")
    p.add_argument("-n", "--runs", type=int, default=10, help="Runs per command and tree.")
    p.add_argument("--cold", action="store_true",
                   help="No bytecode cache: vidpoll's sources compiled on every run.")
    p.add_argument("--out", type=Path, help="Append one JSON line per measurement here too.")
    args = p.parse_args()
    if not VIDPOLL.exists():
        raise SystemExit(f"no console script at {VIDPOLL}: `make install` first")
    srcs = [s.resolve() for s in args.src or [ROOT / "src"]]
    results = measure(srcs, args.runs, args.cold)
    print(f"{'command':<26} {'median s':>9} {'max s':>7}  heavy modules loaded   (source tree)")
    for r in results:
        heavy = ", ".join(r["heavy_modules"]) or "none"
        print(f"{r['command']:<26} {r['median_cpu_s']:>9.3f} {r['max_cpu_s']:>7.3f}  {heavy}"
              f"   ({r['src']})")
    if args.out:
        with args.out.open("a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
