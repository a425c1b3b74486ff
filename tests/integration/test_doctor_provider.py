"""`vidpoll doctor` checks each account's base URL and key with one status read of a job id
that cannot exist (issue 17, item 1): the provider's own "not found" proves both right; a
refused key, or an answer that is not the provider's (a wrong path, a proxy's page, nothing
listening), fails with the URL tried. The key never appears."""

from __future__ import annotations

import json
import socket

from vidpoll import doctor
from vidpoll.doctor import FAIL, OK

from ..conftest import API_KEY
from .test_process import cli_env
from .test_submit_process import run_cli

PROXY_404 = {"http": 404, "raw": "<html><body><h1>404 Not Found</h1>nginx</body></html>",
             "content_type": "text/html"}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_doctor_passes_the_right_base_url_and_names_a_wrong_one(fake, fake_url):
    check_providers = doctor.check_providers
    right = await check_providers(fake_url, {"default": API_KEY, "acme": API_KEY}, 2.0)
    assert [(f.check, f.status) for f in right] == [("provider: acme", OK),
                                                    ("provider: default", OK)], right
    assert "HTTP 404 not_found" in right[0].detail

    wrong = f"{fake_url}/wrong"
    [finding] = await check_providers(wrong, {"default": API_KEY}, 2.0)
    assert finding.status == FAIL
    assert finding.detail.startswith(
        f"base URL looks wrong: {wrong}/v1/jobs/vidpoll-doctor-probe-"), finding
    assert "HTTP 404 (plain text)" in finding.detail and "SUME_BASE_URL" in finding.fix

    fake.config.front_answer = PROXY_404  # a proxy's page in the provider's place
    [finding] = await check_providers(fake_url, {"default": API_KEY}, 2.0)
    fake.config.front_answer = None
    assert finding.status == FAIL and "an HTML page" in finding.detail, finding
    assert finding.detail.startswith(f"base URL looks wrong: {fake_url}/v1/jobs/")

    nobody = f"http://127.0.0.1:{closed_port()}/v1"
    [finding] = await check_providers(nobody, {"default": API_KEY}, 2.0)
    assert finding.status == FAIL and finding.detail.startswith(
        f"base URL looks wrong: {nobody}/v1/jobs/vidpoll-doctor-probe-"), finding
    assert "no answer" in finding.detail

    refused_key = "sk-refused-0a1b2c3d"
    [finding] = await check_providers(fake_url, {"acme": refused_key}, 2.0)
    assert finding.status == FAIL and finding.check == "provider: acme"
    assert "refused the API key of account 'acme'" in finding.detail, finding
    assert "SUME_API_KEY_ACME" in finding.fix

    [finding] = await check_providers(fake_url, {}, 2.0)
    assert finding.status == OK and "not checked" in finding.detail

    shown = repr(right) + repr(finding)
    assert API_KEY not in shown and refused_key not in shown


async def test_doctor_command_fails_on_a_wrong_base_url_without_showing_the_key(
        db_url, fake, fake_url):
    code, out, err = await run_cli(cli_env(db_url, f"{fake_url}/wrong"), "doctor", "--json")
    findings = {f["check"]: f for f in json.loads(out)}
    assert findings["provider: default"]["status"] == "fail", out
    assert f"{fake_url}/wrong/v1/jobs/" in findings["provider: default"]["detail"]
    assert code == 1, err
    assert API_KEY not in out + err
    code, out, err = await run_cli(cli_env(db_url, f"{fake_url}/wrong"), "doctor")
    assert code == 1 and API_KEY not in out + err  # the table (its columns fold long text)
