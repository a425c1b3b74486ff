"""Issue 18, item 2: the key scrub works on decoded values, so no encoding hides an echoed
key (raw, `\\/`, `\\uXXXX`, percent, HTML, an object key, JSON inside a string), error bodies
lose every URL's query string however the URL is escaped, a status answer's URLs lose theirs
whatever its status (a result keeps its signed links), and no depth raises RecursionError."""

from __future__ import annotations

import base64
import html
import json
import re
from urllib.parse import quote, quote_plus, unquote

from hypothesis import given, settings
from hypothesis import strategies as st

from vidpoll.media import redact_urls, shown_url, without_signatures
from vidpoll.providers.sume.client import _scrub_body

KEY = "sk_live/Ab+Cd=Ef/0123456789=="
KEY_B = KEY.encode()
SIGNED = "https://cdn.example/v.mp4?X-Amz-Signature=deadbeef01&X-Amz-Expires=60"


def u_escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


def envelope(message_json: str) -> bytes:
    """Sume's error envelope with `message_json` (already JSON text) as its message."""
    return ('{"error": {"code": "invalid_request", "message": ' + message_json + "}}").encode()


def message_of(body: bytes) -> str:
    return str(json.loads(body)["error"]["message"])


def test_a_key_echoed_raw_or_with_escaped_slashes_is_redacted():
    raw = envelope(json.dumps(f"bad key {KEY}"))
    escaped = envelope(json.dumps(f"bad key {KEY}").replace("/", "\\/"))
    assert KEY_B not in escaped  # what slipped past the raw search
    for body in (raw, escaped):
        assert message_of(_scrub_body(body, KEY_B, 400)) == "bad key <redacted>", body


def test_a_key_echoed_fully_u_escaped_is_redacted():
    body = envelope(f'"bad key {u_escaped(KEY)}"')
    assert message_of(_scrub_body(body, KEY_B, 400)) == "bad key <redacted>"
    # one character escaped is enough to hide it from a byte search
    body = envelope(f'"bad key {KEY[:7]}{u_escaped(KEY[7])}{KEY[8:]}"')
    assert message_of(_scrub_body(body, KEY_B, 200)) == "bad key <redacted>"


def test_a_key_echoed_percent_encoded_is_redacted():
    lower = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(KEY, safe=""))
    for encoded in (quote(KEY, safe=""), lower,
                    quote(quote(KEY, safe=""), safe="")):  # twice over: %252F
        body = envelope(json.dumps(f"GET /v1?api_key={encoded}&x=1 refused"))
        assert message_of(_scrub_body(body, KEY_B, 400)) == (
            "GET /v1?api_key=<redacted>&x=1 refused"), encoded


def test_a_key_in_an_object_key_is_redacted():
    body = json.dumps({"headers": {f"Bearer {KEY}": True}}).replace("/", "\\/").encode()
    assert json.loads(_scrub_body(body, KEY_B, 400)) == {"headers": {"Bearer <redacted>": True}}


def test_a_key_in_json_inside_a_json_string_is_redacted():
    inner = json.dumps({"authorization": f"Bearer {KEY}"}).replace("/", "\\/")
    body = json.dumps({"error": {"code": "x", "message": inner}}).encode()
    assert KEY_B not in body and KEY not in json.loads(body)["error"]["message"]
    assert json.loads(message_of(_scrub_body(body, KEY_B, 400))) == {
        "authorization": "Bearer <redacted>"}


def test_non_json_error_bodies_lose_the_key_in_every_form_and_escaped_urls():
    entities = "".join({"/": "&#x2F;", "=": "&#61;", "+": "&plus;"}.get(c, c) for c in KEY)
    escaped_url = SIGNED.replace("/", "\\/")
    for status, body in (
            (400, f"<html><p>Authorization: Bearer {entities}</p></html>"),
            (500, f"upstream said: Bearer {KEY.replace('/', chr(92) + '/')} for {escaped_url}"),
            (502, f'{{"cut short": "{u_escaped(KEY)}", "url": "{escaped_url}'),
            (500, f"<a href=\"{html.escape(SIGNED)}\">{quote(KEY, safe='')}</a>"),
            (400, f"next=https%3A%2F%2Fcdn.example%2Fv.mp4%3Fsig%3Ddeadbeef01 key={KEY}"),
            (502, f"see https:&#x2F;&#x2F;cdn.example&#x2F;v.mp4?sig=deadbeef01 {KEY}")):
        out = _scrub_body(body.encode(), KEY_B, status).decode()
        assert "<redacted>" in out, (status, body, out)
        assert "deadbeef01" not in out, (status, body, out)
        assert ("cdn.example" in out) == ("cdn.example" in _decoded(body)), (status, out)
        assert not _decodes_to_key(out), (status, body, out)


def test_a_2xx_status_answer_loses_its_urls_query_a_result_keeps_its_signed_links():
    status = json.dumps({"sume_status": "running", "preview_url": SIGNED,
                         "note": f"see {SIGNED.replace('/', chr(92) + '/')}"}).encode()
    shown = json.loads(_scrub_body(status, KEY_B, 200))
    assert shown["preview_url"] == "https://cdn.example/v.mp4"
    assert "deadbeef01" not in shown["note"]
    result = json.dumps({"videos": [{"url": SIGNED}], "debug": KEY}).replace(
        "/", "\\/").encode()
    kept = json.loads(_scrub_body(result, KEY_B, 200, keep_links=True))
    assert kept == {"videos": [{"url": SIGNED}], "debug": "<redacted>"}  # never the key
    # a result's error is an error: its links go
    assert b"deadbeef01" not in _scrub_body(result, KEY_B, 404, keep_links=True)


def test_bodies_nested_500_and_100000_deep_are_scrubbed_without_recursion():
    leaf = json.dumps(f"{SIGNED} {KEY}")
    for depth in (500, 100_000):
        for status in (200, 500):
            body = ('{"a": ' * depth + leaf + "}" * depth).encode()
            out = _scrub_body(body, KEY_B, status)
            assert b"deadbeef01" not in out and KEY_B not in out, (depth, status)
            assert len(out) <= len(body)
            if depth == 500:  # JSON python parses: still JSON, scrubbed value by value
                node = json.loads(out)
                for _ in range(depth):
                    node = node["a"]
                assert node == "https://cdn.example/v.mp4 <redacted>"
    deep = {"a": [{"b": SIGNED}]}
    for _ in range(100_000):
        deep = {"a": deep}
    shown = without_signatures(deep)  # what jobs show and the dashboard apply: iterative too
    for _ in range(100_000):
        shown = shown["a"]
    assert shown == {"a": [{"b": "https://cdn.example/v.mp4"}]}


def test_redact_urls_drops_the_query_of_escaped_urls_and_keeps_plain_ones_as_before():
    assert redact_urls(f"GET {SIGNED} failed") == "GET https://cdn.example/v.mp4 failed"
    assert redact_urls("x https://cdn/a%20b.mp4?sig=1") == "x https://cdn/a%20b.mp4"
    for escaped in (SIGNED.replace("/", "\\/"), SIGNED.replace("/", "\\\\/"),
                    SIGNED.replace("/", "\\u002F").replace("?", "\\u003f"),
                    quote(SIGNED, safe=""), quote(quote(SIGNED, safe=""), safe=""),
                    SIGNED.replace("/", "&#x2F;"), SIGNED.replace("/", "&sol;")):
        assert redact_urls(f"see {escaped} now") == "see https://cdn.example/v.mp4 now", escaped


def _decoded(text: str) -> str:
    """`text` with every escape in it undone (any order, repeated)."""
    for _ in range(4):
        text = re.sub(r"\\+u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)
        text = unquote(html.unescape(re.sub(r"\\+([/\"])", r"\1", text)))
    return text


def _decodes_to_key(text: str) -> bool:
    decoded = _decoded(text)
    return KEY in decoded or KEY.replace("+", " ") in decoded  # a form-decoded `+`


FORMS = st.sampled_from(["raw", "slash", "u", "U", "pct", "pct2", "dec", "hex", "named",
                         "space"])


def _encode(char: str, form: str) -> str:
    return {"raw": char, "slash": "\\/" if char == "/" else char,
            "u": f"\\u{ord(char):04x}", "U": f"\\u{ord(char):04X}",
            "pct": f"%{ord(char):02X}", "pct2": f"%25{ord(char):02x}",
            "dec": f"&#{ord(char)};", "hex": f"&#x{ord(char):x};",
            "named": {"/": "&sol;", "+": "&plus;", "=": "&equals;"}.get(char, char),
            "space": " " if char == "+" else char}[form]


@settings(max_examples=60, deadline=None)
@given(forms=st.lists(FORMS, min_size=len(KEY), max_size=len(KEY)),
       status=st.sampled_from([200, 400, 500]), as_json=st.booleans())
def test_the_key_in_any_mix_of_forms_never_survives(forms, status, as_json):
    echoed = "".join(_encode(c, f) for c, f in zip(KEY, forms, strict=True))
    body = (envelope(f'"key {echoed} refused"') if as_json
            else f"<p>key {echoed} refused</p>".encode())
    out = _scrub_body(body, KEY_B, status).decode()
    assert not _decodes_to_key(out), (echoed, out)
    if as_json:
        json.loads(out)  # still JSON


FRAGMENTS = st.sampled_from([
    "https:", "\\/", "\\\\/", "//", "\\u002f", "\\ud800", "\\udc00", "%2F", "%3A", "%3F", "%ff",
    "%25", "&#x2F;", "&#47", "&sol;", "&#xd800;", "?sig=1", "#f", "@", "\"", "{", "}", "[", "]",
    ":", ",", "\\", "\n", "\x00", "é", "\udcff", KEY[:5], KEY[5:], "=", "+"])


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(FRAGMENTS | st.text(max_size=4), max_size=30),
       tail=st.binary(max_size=4), status=st.sampled_from([200, 400, 502]),
       keep_links=st.booleans())
def test_any_body_is_scrubbed_without_raising(parts, tail, status, keep_links):
    body = "".join(parts).encode("utf-8", "surrogateescape") + tail
    out = _scrub_body(body, KEY_B, status, keep_links=keep_links)
    assert isinstance(out, bytes) and KEY_B not in out


def test_a_key_in_a_duplicated_json_member_is_redacted():
    # json keeps the last member of a name: the first, with the key, was in no value
    for echoed in (KEY, KEY.replace("/", "\\/"), u_escaped(KEY)):
        body = ('{"error": "invalid key ' + echoed + '", "error": "invalid_api_key"}').encode()
        out = _scrub_body(body, KEY_B, 400)
        assert not _decodes_to_key(out.decode()), (echoed, out)
        assert json.loads(out) == {"error": "invalid_api_key"}
    # a signed link in a duplicated member of a status answer goes too
    body = ('{"preview_url": "' + SIGNED + '", "preview_url": "x"}').encode()
    assert b"deadbeef01" not in _scrub_body(body, KEY_B, 200)
    # nothing to scrub: the body as it came, duplicates and all
    plain = b'{"error": "a", "error": "b"}'
    assert _scrub_body(plain, KEY_B, 400) is plain


def test_a_key_whose_plus_was_form_decoded_to_a_space_is_redacted():
    spaced = KEY.replace("+", " ")
    for status, body in (
            (400, f"key={spaced} refused"),
            (400, json.dumps({"error": f"invalid key {spaced}"})),
            (400, f"GET /v1?key={quote_plus(spaced)}"),  # the space as `+`, the rest %XX
            (400, f"GET /v1?key={quote(spaced, safe='')}"),  # decoded, then quoted: %20
            (200, f"<p>{html.escape(spaced)}</p>")):
        out = _scrub_body(body.encode(), KEY_B, status).decode()
        assert "<redacted>" in out and not _decodes_to_key(out), (body, out)


def _text_of(body: bytes) -> str:
    return body.decode(json.detect_encoding(body))


def test_utf16_and_utf32_bodies_lose_the_key_and_signed_links():
    escaped = KEY.replace("/", "\\/")
    texts = [f"error: bad key {KEY}", json.dumps({"error": f"bad key {KEY}"}),
             json.dumps({"error": f"bad key {escaped} for {SIGNED}"}),
             f"<p>{quote(KEY, safe='')} {html.escape(SIGNED)}</p>"]
    for text in texts:
        for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"):
            body = text.encode(encoding)
            out = _scrub_body(body, KEY_B, 400)
            shown = _text_of(out)
            assert "<redacted>" in shown, (encoding, text, shown)
            assert not _decodes_to_key(shown) and "deadbeef01" not in shown, (encoding, shown)
    # the key's UTF-16 bytes inside a UTF-8 body: they go, the rest stays as it was
    body = b"header: " + KEY.encode("utf-16-le") + b" end"
    out = _scrub_body(body, KEY_B, 400)
    assert KEY.encode("utf-16-le") not in out and out.startswith(b"header: ")
    # a UTF-16 body with nothing to scrub comes back as it came
    clean = json.dumps({"error": "bad request"}).encode("utf-16")
    assert _scrub_body(clean, KEY_B, 400) is clean


def test_a_key_echoed_base64_encoded_is_redacted():
    for raw in (KEY_B, KEY_B + b":", b"user:" + KEY_B, b"ab:" + KEY_B + b":pw"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(raw).decode()
            for body in (f"Authorization: Basic {encoded}",
                         json.dumps({"auth": f"Basic {encoded}"}).replace("/", "\\/")):
                out = _scrub_body(body.encode(), KEY_B, 401).decode()
                assert "<redacted>" in out, (raw, body, out)
                # at most the few bits a boundary character shares with what surrounds it
                assert encoded[4:-4] not in out and len(out) < len(body), (raw, out)


def test_shown_url_keeps_the_brackets_of_an_ipv6_host():
    assert shown_url("https://[::1]:35009/v.mp4?sig=1") == "https://[::1]:35009/v.mp4"
    assert shown_url("http://u:p@[2001:db8::1]/a#f") == "http://[2001:db8::1]/a"
    assert redact_urls("GET https://[::1]/v?sig=1 failed") == "GET https://[::1]/v failed"


def test_a_url_after_digits_or_a_plus_keeps_what_came_before():
    # a match starts where the run of scheme characters starts; what precedes the letter
    # that starts the scheme stays as written
    assert redact_urls("id=12https://cdn/v?sig=1 x") == "id=12https://cdn/v x"
    assert redact_urls("1+https%3A%2F%2Fcdn%2Fv%3Fsig%3D1") == "1+https://cdn/v"
    assert redact_urls("x+https://cdn/v?sig=1") == "x+https://cdn/v"


def test_a_json_body_with_nothing_to_scrub_is_returned_as_it_came() -> None:
    # the review: a `\u002f` escape looked like a URL scheme to the text scrub, and the
    # body was written again (1.50 became 1.5, é became \u00e9) with nothing removed
    for body in (b'{"error": "1\\u002f://&#47;=1 /", "x": 1.50}',
                 '{"error": "caf\u00e9 ferm\u00e9", "n": 1e400}'.encode()):
        assert _scrub_body(body, b"sk-live-Abc123xyz789", 500) is body
