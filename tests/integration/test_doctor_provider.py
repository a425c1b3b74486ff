"""`vidpoll doctor` checks each account's base URL and key with one status read of a job id
that cannot exist (issue 17, item 1): the provider's own "not found" proves both right; a
refused key, or an answer that is not the provider's (a wrong path, a proxy's page, nothing
listening), fails with the URL tried. The key never appears."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vidpoll import doctor
from vidpoll.doctor import FAIL, OK, WARN
from vidpoll.providers.sume.client import SumeClient

from ..conftest import API_KEY, free_port
from .test_process import cli_env
from .test_submit_process import run_cli

PROXY_404 = {"http": 404, "raw": "<html><body><h1>404 Not Found</h1>nginx</body></html>",
             "content_type": "text/html"}


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

    nobody = f"http://127.0.0.1:{free_port()}/v1"
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


CONTROL_KEY = "sk-ab\x01cd-secret"
"""A key with a control character (pasted with an escape): aiohttp refuses to write it."""


async def test_doctor_reports_a_key_no_header_can_carry_and_never_crashes(fake, fake_url):
    # the review: `ValueError: Forbidden control character` from aiohttp, and a traceback
    findings = await doctor.check_providers(fake_url, {"acme": CONTROL_KEY, "default": API_KEY},
                                            2.0)
    by_check = {f.check: f for f in findings}
    bad = by_check["provider: acme"]
    assert bad.status == FAIL and "account 'acme'" in bad.detail, bad
    assert "control character" in bad.detail and "SUME_API_KEY_ACME" in bad.fix
    assert by_check["provider: default"].status == OK  # the other account is still checked
    assert "ab\x01cd" not in repr(findings) and API_KEY not in repr(findings)
    assert fake.auth_failures == 0  # nothing was sent with that key


async def test_doctor_turns_one_accounts_exception_into_its_finding(fake, fake_url, monkeypatch):
    real = SumeClient.read_status

    async def read_status(self: Any, job_id: str) -> Any:
        if self._api_key == "sk-boom-0123456789":
            raise ValueError("header Authorization: Bearer sk-boom-0123456789 is bad")
        return await real(self, job_id)

    monkeypatch.setattr(SumeClient, "read_status", read_status)
    findings = await doctor.check_providers(
        fake_url, {"boom": "sk-boom-0123456789", "default": API_KEY}, 2.0)
    by_check = {f.check: f for f in findings}
    bad = by_check["provider: boom"]
    assert bad.status == FAIL and "could not check account 'boom': ValueError" in bad.detail
    assert "sk-boom" not in repr(findings), findings
    assert by_check["provider: default"].status == OK


async def test_a_header_aiohttp_refuses_is_a_transport_answer_not_an_exception(fake_url):
    from yarl import URL
    async with SumeClient(fake_url, API_KEY) as client:
        answer = await client._call("GET", URL(f"{fake_url}/v1/jobs/x/status"),
                                    headers={"X-Odd": "a\x01b"})
    assert answer.status is None and answer.transport_error is not None
    assert answer.detail.startswith("not sent: a request header could not be written")


@pytest.mark.parametrize(("status", "raw", "content_type", "said"), [
    (302, "", "text/plain", "a redirect"),
    (200, "<!doctype html><html><body>Welcome</body></html>", "text/html", "an HTML page"),
])
async def test_doctor_warns_on_a_redirect_or_a_web_page(fake, fake_url, status, raw,
                                                        content_type, said):
    # the worker takes these for one row's error (a provider may send a broken body now and
    # then) and names the URL after a streak of them; doctor warns, it does not fail
    fake.config.front_answer = {"http": status, "raw": raw, "content_type": content_type,
                                "headers": {"Location": "https://example.com/login"}
                                if status == 302 else None}
    [finding] = await doctor.check_providers(fake_url, {"default": API_KEY}, 2.0)
    assert finding.status == WARN, finding
    assert finding.detail.startswith(f"base URL is probably wrong: {fake_url}/v1/jobs/")
    assert f"HTTP {status} ({said})" in finding.detail and "SUME_BASE_URL" in finding.fix
