"""`vidpoll submit` for the studios' APIs (issue 29), as a user runs it: a body the provider
cannot take with that model, or a prompt file for a provider whose creates name a model, is
one line on stderr, exit 2, and nothing recorded. Real PostgreSQL; nothing is sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

VIDPOLL = str(Path(sys.executable).with_name("vidpoll"))
ACCOUNTS = """
[accounts.luma]
provider = "luma"
api_key_env = "LUMAAI_API_KEY"
"""


def run(tmp_path: Path, db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "vidpoll.toml").write_text(ACCOUNTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(DATABASE_URL=db_url, LUMAAI_API_KEY="luma-not-a-real-key-0123456789")
    return subprocess.run([VIDPOLL, *args], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=60, check=False)


def test_a_refused_body_or_prompt_file_is_one_line_exit_2_and_nothing_recorded(tmp_path, db_url):
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"prompt": "a heron", "model": "ray-flash-2"}))
    refused = run(tmp_path, db_url, "submit", "--account", "luma", "--model", "ray-2",
                  "--json", str(body), "--key", "k-1")
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and "Traceback" not in refused.stderr
    assert "luma" in refused.stderr and "model" in refused.stderr
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a heron\na fox\n")
    bulk = run(tmp_path, db_url, "submit", "--account", "luma", "--file", str(prompts))
    assert bulk.returncode == 2, bulk.stderr
    assert "--json and --model" in bulk.stderr and "Traceback" not in bulk.stderr
    listed = run(tmp_path, db_url, "intents", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "k-1" not in listed.stdout and "heron" not in listed.stdout
