"""Luma's client against the fake Luma (vidpoll.providers.luma.fake), real HTTP over loopback:
what each create sends (the model from --model, the account's callback URL), what it refuses
unsent, how reads come back, and how a look-up pages through the account's generations:
offsets, pages that shift under new generations, a list that moves up under a deletion, and
failed pages surfaced for the core to try again."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from vidpoll.policy import parsed_json_object
from vidpoll.providers.base import (
    CreatedPage,
    CreateLookup,
    Pending,
    ProviderOptions,
    Terminal,
)
from vidpoll.providers.luma.client import PAGE_LIMIT, LumaClient
from vidpoll.providers.luma.fake import (
    DEFAULT_KEY,
    FakeLuma,
    LumaFakeConfig,
    start_fake_luma,
)
from vidpoll.providers.luma.rules import RULES
from vidpoll.reconcile import Lookups, Wanted

MODEL = "ray-2"
PAYLOAD = {"prompt": "a heron at dawn", "aspect_ratio": "16:9", "loop": False}
HOOK = "https://hooks.example/webhooks/luma"
EARLY = datetime(2000, 1, 1, tzinfo=UTC)
LATE = datetime(2100, 1, 1, tzinfo=UTC)


async def _no_wait(_: float) -> None:
    return None


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeLuma, str]]:
    fake = FakeLuma(LumaFakeConfig(queued_s=0.05, processing_s=30.0, seed=3))
    runner, url = await start_fake_luma(fake)
    try:
        yield fake, url
    finally:
        await runner.cleanup()


def body_of(answer: Any) -> dict[str, Any]:
    found = parsed_json_object(answer.body)
    assert found is not None, answer
    return found


async def walk(client: LumaClient, since: datetime = EARLY,
               until: datetime = LATE) -> list[CreatedPage]:
    """Every page of one walk, as the core would read them (no retries)."""
    pages: list[CreatedPage] = []
    cursor: str | None = None
    while True:
        page = await client.list_created(MODEL, since, until, cursor)
        pages.append(page)
        if page.next_cursor is None:
            return pages
        assert len(pages) < 50, "the walk does not end"
        cursor = page.next_cursor


def ids(pages: list[CreatedPage]) -> list[str | None]:
    return [e.job_id for p in pages for e in p.entries]


def listed_now(fake: FakeLuma) -> list[str]:
    """Every generation the fake lists, newest first."""
    alive = [g for g in fake.generations.values() if not g.deleted]
    return [g.id for g in sorted(alive, key=lambda g: (g.created_at, g.seq), reverse=True)]


async def find(client: LumaClient, payload: dict[str, Any], *,
               since: datetime = EARLY) -> CreateLookup:
    """One look-up through the core's walk (vidpoll.reconcile), its waits skipped."""
    lookups = Lookups(random.Random(0), sleep=_no_wait)
    return await lookups.find("luma", client, RULES,
                              Wanted("k", payload, MODEL, since, LATE, LATE))


# ---- creates and reads ----

async def test_a_create_sends_the_body_with_the_model_and_the_accounts_callback_url(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    mine = {**PAYLOAD, "callback_url": "https://mine.example/cb"}
    async with LumaClient(url, DEFAULT_KEY, options=ProviderOptions(webhook_url=HOOK)) as c:
        answer = await c.create_video(mine, "key-1", MODEL)
    assert answer.status == 201
    job_id = RULES.created_job_id(body_of(answer))
    assert job_id is not None and job_id in fake.generations
    # the body as sent (the fake keeps it as received): --model set, the account's hook
    assert fake.generations[job_id].request == {**PAYLOAD, "model": MODEL, "callback_url": HOOK}
    assert "key-1" not in str(fake.generations[job_id].request)  # no idempotency key


async def test_without_a_webhook_url_the_bodys_own_callback_url_goes_unchanged(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    async with LumaClient(url, DEFAULT_KEY) as client:
        own = await client.create_video({**PAYLOAD, "callback_url": "https://mine.example/cb",
                                         "model": MODEL}, "k1", MODEL)
        none = await client.create_video(PAYLOAD, "k2", MODEL)
    first, second = (fake.generations[body_of(a)["id"]].request for a in (own, none))
    assert first == {**PAYLOAD, "model": MODEL, "callback_url": "https://mine.example/cb"}
    assert second == {**PAYLOAD, "model": MODEL}


@pytest.mark.parametrize(("payload", "model", "said"), [
    (PAYLOAD, None, "no --model"),
    (PAYLOAD, "ray 2", "not a Luma model id"),
    ({**PAYLOAD, "model": "ray-flash-2"}, MODEL, "another model"),
])
async def test_a_create_luma_cannot_take_is_refused_unsent_in_lumas_shape(
        served: tuple[FakeLuma, str], payload: dict[str, Any], model: str | None,
        said: str) -> None:
    fake, url = served
    async with LumaClient(url, DEFAULT_KEY) as client:
        answer = await client.create_video(payload, "k", model)
    assert answer.status == 422 and fake.create_posts == 0
    code, message = RULES.error_code(body_of(answer))
    assert code == "detail" and message is not None and said in message
    assert message.startswith("not sent")


async def test_a_key_no_header_can_carry_is_never_sent(served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    async with LumaClient(url, "luma-bad\nkey") as client:
        create = await client.create_video(PAYLOAD, "k", MODEL)
        page = await client.list_created(MODEL, EARLY, LATE, None)
        assert "luma-bad" not in repr(client)
    # a 401 in Luma's shape: the account pauses, the intent stays queued (never an unknown
    # create: nothing was sent)
    assert create.status == 401 and RULES.error_code(body_of(create))[0] == "detail"
    assert page.calls == 0 and page.final and fake.create_posts == fake.list_reads == 0


async def test_reads_follow_the_generation_to_its_end(served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    async with LumaClient(url, DEFAULT_KEY) as client:
        made = [body_of(await client.create_video(PAYLOAD, f"k{n}", MODEL))["id"]
                for n in range(2)]
        assert RULES.read_status(body_of(await client.read_status(made[0]))) in (
            Pending("queued"), Pending("dreaming"))
        fake.finish(made[0], "completed")
        fake.finish(made[1], "failed", "Frame moderation failed")
        done = body_of(await client.read_status(made[0]))
        failed = body_of(await client.read_status(made[1]))
        result = body_of(await client.read_result(made[0]))
        missing = await client.read_status("00000000-0000-4000-8000-000000000000")
    assert RULES.read_status(done) == Terminal("completed", "succeeded")
    assert RULES.media_urls(result) == [fake.media_url(made[0])]
    assert RULES.read_status(failed) == Terminal("failed", "failed", "Frame moderation failed")
    # Luma's own 404 carries its envelope (so it ends the job, never pauses the account)
    assert missing.status == 404 and RULES.error_code(body_of(missing)) == (
        "detail", "Generation not found")


async def test_a_wrong_key_is_refused_in_lumas_envelope(served: tuple[FakeLuma, str]) -> None:
    _, url = served
    async with LumaClient(url, "luma-not-the-key") as client:
        answer = await client.read_status("00000000-0000-4000-8000-000000000000")
    assert answer.status == 401 and RULES.error_code(body_of(answer))[0] == "detail"
    assert b"luma-not-the-key" not in answer.body


# ---- the list ----

async def test_a_walk_reads_every_generation_once_each_page_starting_at_the_last_ones_end(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    fake.add_foreign_generations(230)
    expected = listed_now(fake)
    async with LumaClient(url, DEFAULT_KEY) as client:
        pages = await walk(client)
    assert all(p.failure is None and not p.detail for p in pages)
    seen = ids(pages)
    # pages of 100 overlapping by one (each starts at the previous page's oldest): 0, 99, 198
    assert fake.list_reads == len(pages) == 3
    assert [len(p.entries) for p in pages] == [100, 100, 32]
    assert list(dict.fromkeys(seen)) == expected  # every one, in order, none skipped
    assert len(seen) - len(set(seen)) == 2  # the two anchors, read twice
    first = pages[0].entries[0]
    g = fake.generations[expected[0]]
    assert first.created_at is not None
    assert abs(first.created_at.timestamp() - g.created_at) < 1e-5
    assert first.entry["request"] == g.request and first.handle is None


async def test_pages_that_do_not_say_has_more_are_followed_until_one_adds_nothing(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    fake.add_foreign_generations(230)
    fake.on_list_page = lambda f, body: body.pop("has_more")
    async with LumaClient(url, DEFAULT_KEY) as client:
        pages = await walk(client)
    assert all(p.failure is None and not p.detail for p in pages)
    # a short page is no proof of the end (Luma may cut `limit`): one more read, which
    # holds only the last page's oldest generation, ends it
    assert [len(p.entries) for p in pages] == [100, 100, 32, 1]
    assert list(dict.fromkeys(ids(pages))) == listed_now(fake)


async def test_a_walk_stops_at_the_first_page_older_than_its_window(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    fake.add_foreign_generations(150)
    since = datetime.now(UTC)
    for g in list(fake.generations.values()):
        g.created_at -= 3600.0  # made an hour before the window
    fake.add_foreign_generations(150)
    async with LumaClient(url, DEFAULT_KEY) as client:
        pages = await walk(client, since=since)
    # page 2 (offset 99) reaches the old ones: no third page, though Luma has more
    assert len(pages) == fake.list_reads == 2
    assert all(e.created_at is not None and e.created_at >= since
               for e in pages[0].entries)


async def test_new_generations_during_a_walk_shift_the_pages_but_skip_nothing(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    async with LumaClient(url, DEFAULT_KEY) as client:
        mine = body_of(await client.create_video(PAYLOAD, "k-mine", MODEL))["id"]
        fake.add_foreign_generations(260)
        before = set(listed_now(fake))
        fake.config.shift_on_list = 7  # seven more arrive after each page
        pages = await walk(client)
        seen = ids(pages)
        assert all(not p.detail and p.failure is None for p in pages)
        assert before <= set(seen)  # all that were there when it began
        assert len(seen) > len(set(seen)) + len(pages) - 1  # some read twice: that is fine
        # a look-up finds the create on the last page all the same
        lookup = await find(client, PAYLOAD)
    assert lookup.complete and lookup.matches == (mine,)


async def test_a_walk_pushed_down_a_whole_page_looks_further_for_its_anchor(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    fake.add_foreign_generations(180)
    before = listed_now(fake)
    pushed: list[int] = []

    def once(f: FakeLuma, _body: dict[str, Any]) -> None:
        if not pushed:
            pushed.append(len(f.add_foreign_generations(PAGE_LIMIT + 50)))

    fake.on_list_page = once
    async with LumaClient(url, DEFAULT_KEY) as client:
        pages = await walk(client)
    assert all(not p.detail for p in pages)
    # page 2 held only newer ones (the anchor had moved 150 down): page 3 found it
    assert len(pages) == 4
    assert set(before) <= set(ids(pages))


async def test_a_deletion_during_a_walk_ends_it_unproven_instead_of_skipping(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    async with LumaClient(url, DEFAULT_KEY) as client:
        mine = body_of(await client.create_video(PAYLOAD, "k-mine", MODEL))["id"]
        fake.add_foreign_generations(250)
        listed = listed_now(fake)
        doomed = iter(listed[10:20])

        def delete_one(f: FakeLuma, body: dict[str, Any]) -> None:
            if len(body["generations"]) == PAGE_LIMIT:  # after a full page: one deleted
                f.generations[next(doomed)].deleted = True

        fake.on_list_page = delete_one
        pages = await walk(client)
        # page two found the list moved up: it ends the walk rather than skip what crossed
        assert len(pages) == 2 and pages[-1].final and "moved up" in pages[-1].detail
        # through the core: what was read counts, but nothing is proven
        lookup = await find(client, PAYLOAD)
    assert not lookup.complete and "moved up" in lookup.detail
    assert lookup.matches == ()  # the create is on page three, never read
    fake.on_list_page = None
    async with LumaClient(url, DEFAULT_KEY) as client:
        lookup = await find(client, PAYLOAD)
    assert lookup.complete and lookup.matches == (mine,)


async def test_a_page_whose_offset_is_not_the_one_asked_for_ends_the_walk(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    fake.add_foreign_generations(120)
    fake.on_list_page = lambda f, body: body.update(offset=0)  # a server that ignores offset
    async with LumaClient(url, DEFAULT_KEY) as client:
        pages = await walk(client)
    assert len(pages) == 2 and pages[-1].final and "offset" in pages[-1].detail


@pytest.mark.parametrize("cursor", ["99", "[1, 2]", '[-1, "x", null]', '[true, "x", null]',
                                    "x" * 5000])
async def test_a_cursor_this_client_never_wrote_is_refused_unsent(
        served: tuple[FakeLuma, str], cursor: str) -> None:
    fake, url = served
    async with LumaClient(url, DEFAULT_KEY) as client:
        page = await client.list_created(MODEL, EARLY, LATE, cursor)
    assert page.final and page.calls == 0 and fake.list_reads == 0


@pytest.mark.parametrize(("fault", "status", "said"), [
    ("5xx", 500, "HTTP 500"), ("429", 429, "HTTP 429"),
    ("garbled", 200, 'not {"generations": [...]}')])
async def test_a_failed_page_comes_back_as_a_failure_for_the_core_to_retry(
        served: tuple[FakeLuma, str], fault: str, status: int, said: str) -> None:
    fake, url = served
    fake.add_foreign_generations(3)
    fake.script_lists([fault])
    async with LumaClient(url, DEFAULT_KEY) as client:
        failed = await client.list_created(MODEL, EARLY, LATE, None)
        assert failed.failure is not None and failed.failure.status == status
        assert said in failed.detail and not failed.final and failed.entries == ()
        # the core tries the page again in place: then the walk completes
        fake.script_lists([fault])
        lookup = await find(client, {"prompt": "nothing like it"})
    assert lookup.complete and lookup.matches == () and lookup.calls == 2
    assert lookup.proves_absence


async def test_a_look_up_finds_an_unanswered_create_and_tells_unsure_from_other(
        served: tuple[FakeLuma, str]) -> None:
    fake, url = served
    fake.script_creates(["lose_reply"])
    async with LumaClient(url, DEFAULT_KEY, timeout_s=2.0,
                          options=ProviderOptions(webhook_url=HOOK)) as client:
        lost = await client.create_video(PAYLOAD, "k-lost", MODEL)
        assert lost.transport_error is not None  # billed, the answer never arrived
        fake.add_foreign_generations(120)
        [(billed_id, _)] = fake.billed()
        found = await find(client, PAYLOAD)
        # a body whose field Luma did not echo can be neither adopted nor ruled out
        unsure = await find(client, {**PAYLOAD, "seed": 7})
        other = await find(client, {**PAYLOAD, "prompt": "a crane at dusk"})
    assert found.complete and found.matches == (billed_id,) and found.unsure == ()
    assert unsure.matches == () and unsure.unsure == (billed_id,)
    assert other.matches == () == other.unsure and other.complete
