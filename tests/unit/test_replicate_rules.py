"""Replicate's rules without a server: every status word and shape, its two error bodies, the
create answer's id, where a prediction lists its files, which `--model` it takes, and every
branch of telling whether a listed prediction is an unanswered create's."""

from __future__ import annotations

from typing import Any

import pytest

from vidpoll.models import HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT
from vidpoll.providers import registry
from vidpoll.providers.base import Pending, ResultSource, Terminal, Unreadable
from vidpoll.providers.replicate.rules import RULES, json_equal, model_problem, split_model

VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
OTHER_VERSION = "0" * 64


# --- status -------------------------------------------------------------------------------

@pytest.mark.parametrize("word", ["starting", "processing", "STARTING", " Processing "])
def test_a_prediction_that_has_not_ended_is_pending_with_no_hint(word: str) -> None:
    assert RULES.read_status({"status": word}) == Pending(word.strip().lower(), None, known=True)


@pytest.mark.parametrize(("word", "outcome"), [
    ("succeeded", "succeeded"), ("failed", "failed"), ("canceled", "canceled"),
    ("aborted", "canceled"),  # its deadline passed before it ran: the SDKs' forgotten word
    ("Succeeded", "succeeded"),
])
def test_every_terminal_word_ends_the_job_with_its_outcome(word: str, outcome: str) -> None:
    assert RULES.read_status({"status": word, "output": None}) == Terminal(word.lower(), outcome)


def test_the_words_are_exactly_the_terminal_ones() -> None:
    assert dict(RULES.words) == {"succeeded": "succeeded", "failed": "failed",
                                 "canceled": "canceled", "aborted": "canceled"}


def test_an_unknown_word_keeps_polling_and_is_flagged() -> None:
    assert RULES.read_status({"status": "queued_for_gpu"}) == Pending("queued_for_gpu", None,
                                                                       known=False)


@pytest.mark.parametrize("body", [{}, {"status": None}, {"status": 3}, {"status": ""},
                                  {"status": "  "}, {"status": ["succeeded"]},
                                  {"state": "succeeded"}])
def test_a_body_without_a_status_word_is_unreadable(body: dict[str, Any]) -> None:
    assert isinstance(RULES.read_status(body), Unreadable)


def test_the_provider_is_found_by_name_and_says_what_it_is() -> None:
    provider = registry.load("replicate")
    assert provider.name == "replicate" and provider.title == "Replicate"
    assert provider.default_base_url == "https://api.replicate.com"
    assert provider.env_prefix == "REPLICATE"
    assert provider.default_rates == (3000.0, 600.0)
    assert provider.rules is RULES
    assert "aborted" in registry.job_states()


def test_the_fixed_rules() -> None:
    assert RULES.result_source is ResultSource.INLINE
    assert RULES.idempotency_header is None
    assert RULES.takes_model is True
    assert RULES.min_poll_s == 0.0  # no floor of its own: VIDPOLL_MIN_POLL_S applies
    assert RULES.rate_limit_headers == ("", "")
    assert RULES.result_not_ready(HttpAnswer(404, b""), "detail") is False


# --- errors -------------------------------------------------------------------------------

def test_a_detail_only_body_is_replicates_envelope() -> None:
    assert RULES.error_code({"detail": "Not found."}) == ("detail", "Not found.")


def test_problem_details_give_the_title_as_the_code() -> None:
    body = {"type": "https://replicate.com/docs/reference/http#input-validation",
            "title": "Input validation failed", "status": 422,
            "detail": "- input.prompt: Invalid type. Expected: string, given: integer"}
    assert RULES.error_code(body) == ("Input validation failed", body["detail"])
    assert RULES.error_code({"title": "Unauthenticated", "status": 401}) == (
        "Unauthenticated", None)


def test_the_message_and_the_code_are_bounded() -> None:
    code, message = RULES.error_code({"title": "t" * 1000, "detail": "d" * 10_000,
                                      "status": 400})
    assert code == "t" * 200 and message == "d" * MAX_ERROR_TEXT


@pytest.mark.parametrize("body", [None, {}, {"error": {"code": "x", "message": "y"}},
                                  {"detail": ""}, {"detail": 3}, {"title": "Welcome"},
                                  {"detail": [{"loc": ["body"], "msg": "x"}]},
                                  {"message": "Not Found"}])
def test_any_other_body_is_not_replicates(body: dict[str, Any] | None) -> None:
    assert RULES.error_code(body) == (None, None)


# --- create answer ------------------------------------------------------------------------

def test_the_created_id_is_the_predictions_id() -> None:
    assert RULES.created_job_id({"id": "gm3qorzdhgbfurvjtvhg6dckhu", "status": "starting"}) == (
        "gm3qorzdhgbfurvjtvhg6dckhu")


@pytest.mark.parametrize("body", [None, {}, {"id": None}, {"id": 42}, {"id": ""},
                                  {"id": "a\x00b"}, {"id": "x" * 2000},
                                  {"data": {"id": "nested"}}])
def test_no_usable_id_is_none(body: dict[str, Any] | None) -> None:
    assert RULES.created_job_id(body) is None


# --- media --------------------------------------------------------------------------------

def test_an_output_url_string() -> None:
    url = "https://replicate.delivery/xezq/abc/out.mp4"
    assert RULES.media_urls({"status": "succeeded", "output": url}) == [url]


def test_a_list_of_urls_in_order_without_repeats() -> None:
    a, b = "https://replicate.delivery/a.mp4", "https://replicate.delivery/b.mp4"
    assert RULES.media_urls({"output": [a, b, a]}) == [a, b]


def test_urls_anywhere_in_an_objects_output_in_document_order() -> None:
    output = {"video": "https://replicate.delivery/v.mp4", "seed": 42, "label": "not a url",
              "frames": [{"still": "http://replicate.delivery/1.png"},
                         {"still": "HTTPS://replicate.delivery/2.png"}],
              "deep": {"deeper": [[["https://replicate.delivery/last.wav"]]]},
              "ftp": "ftp://example.com/x", "again": "https://replicate.delivery/v.mp4"}
    assert RULES.media_urls({"output": output}) == [
        "https://replicate.delivery/v.mp4", "http://replicate.delivery/1.png",
        "HTTPS://replicate.delivery/2.png", "https://replicate.delivery/last.wav"]


def test_a_deep_output_is_walked_without_recursion() -> None:
    node: Any = "https://replicate.delivery/bottom.mp4"
    for _ in range(100_000):
        node = [node]
    assert RULES.media_urls({"output": node}) == ["https://replicate.delivery/bottom.mp4"]


@pytest.mark.parametrize("result", [{"output": None, "data_removed": True}, {}, None, [],
                                    {"output": 3}, {"output": "just text"},
                                    {"urls": {"get": "https://api.replicate.com/v1/x"}}])
def test_no_output_no_files(result: Any) -> None:
    assert RULES.media_urls(result) == []


# --- models -------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["black-forest-labs/flux-1.1-pro", "owner/name",
                                   "a_b/c.d-e", f"replicate/hello-world:{VERSION}",
                                   "o/n:AbC123"])
def test_good_models(model: str) -> None:
    assert model_problem(model) is None and RULES.model_problem(model) is None


@pytest.mark.parametrize("model", ["", "owner", "owner/", "/name", "Owner/name", "o/n/x",
                                   "o/n:", "o/n:abc-def", "o/n:v1:v2", "o n/x", "../n",
                                   "o/..", "o/.hidden", "o/n?x=1", "o/n\n", "x" * 101 + "/n"])
def test_bad_models_say_why_in_one_line(model: str) -> None:
    why = model_problem(model)
    assert why is not None and "owner/name" in why and "\n" not in why
    assert split_model(model) is None


def test_a_model_splits_into_its_model_and_version() -> None:
    assert split_model("o/n") == ("o/n", None)
    assert split_model(f"o/n:{VERSION}") == ("o/n", VERSION)


# --- matching a listed prediction to an unanswered create ---------------------------------

PAYLOAD = {"prompt": "a heron at dawn", "duration": 5, "loop": False,
           "camera": {"moves": ["pan", "zoom"]}}


def entry(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "p1", "model": "acme/video", "version": VERSION, "source": "api",
        "status": "processing", "data_removed": False,
        "input": {"prompt": "a heron at dawn", "duration": 5, "loop": False,
                  "camera": {"moves": ["pan", "zoom"]}}}
    base.update(over)
    return base


VERSIONED = f"acme/video:{VERSION}"


def test_the_same_input_and_version_is_the_same() -> None:
    assert RULES.match_created(entry(), PAYLOAD, VERSIONED) == "same"


def test_the_same_input_and_model_is_the_same() -> None:
    assert RULES.match_created(entry(version="hidden"), PAYLOAD, "acme/video") == "same"


def test_fields_replicate_added_do_not_prevent_same() -> None:
    echoed = {**entry()["input"], "fps": 24, "negative_prompt": ""}
    assert RULES.match_created(entry(input=echoed), PAYLOAD, VERSIONED) == "same"


def test_numbers_compare_as_json() -> None:
    echoed = {**entry()["input"], "duration": 5.0}
    assert RULES.match_created(entry(input=echoed), PAYLOAD, VERSIONED) == "same"


def test_a_prediction_made_on_the_website_is_another() -> None:
    assert RULES.match_created(entry(source="web"), PAYLOAD, VERSIONED) == "other"


def test_another_version_is_another() -> None:
    assert RULES.match_created(entry(version=OTHER_VERSION), PAYLOAD, VERSIONED) == "other"


def test_another_model_is_another() -> None:
    assert RULES.match_created(entry(model="acme/other"), PAYLOAD, VERSIONED) == "other"
    assert RULES.match_created(entry(model="acme/other"), PAYLOAD, "acme/video") == "other"


def test_a_field_with_another_value_is_another() -> None:
    for field, value in [("prompt", "a crane at dusk"), ("duration", 6),
                         ("camera", {"moves": ["zoom", "pan"]}),
                         ("camera", {"moves": ["pan", "zoom"], "speed": 1})]:
        echoed = {**entry()["input"], field: value}
        assert RULES.match_created(entry(input=echoed), PAYLOAD, VERSIONED) == "other", field


def test_true_is_not_one() -> None:
    payload = {"loop": True}
    assert RULES.match_created(entry(input={"loop": 1}), payload, VERSIONED) == "other"
    assert RULES.match_created(entry(input={"loop": True}), {"loop": 1}, VERSIONED) == "other"
    assert RULES.match_created(entry(input={"loop": True}), payload, VERSIONED) == "same"
    assert RULES.match_created(entry(input={"n": 0}), {"n": False}, VERSIONED) == "other"


def test_a_field_missing_from_the_echo_is_unsure() -> None:
    echoed = {k: v for k, v in entry()["input"].items() if k != "camera"}
    assert RULES.match_created(entry(input=echoed), PAYLOAD, VERSIONED) == "unsure"


def test_a_difference_proves_another_even_beside_a_missing_field() -> None:
    echoed = {"prompt": "something else"}
    assert RULES.match_created(entry(input=echoed), PAYLOAD, VERSIONED) == "other"


@pytest.mark.parametrize("over", [{"data_removed": True, "input": {}},
                                  {"data_removed": True}, {"input": None}, {"input": "x"}])
def test_an_input_that_cannot_be_compared_is_unsure(over: dict[str, Any]) -> None:
    assert RULES.match_created(entry(**over), PAYLOAD, VERSIONED) == "unsure"


def test_removed_data_of_another_model_is_still_another() -> None:
    assert RULES.match_created(entry(data_removed=True, input={}, version=OTHER_VERSION),
                               PAYLOAD, VERSIONED) == "other"


def test_a_data_uri_field_can_never_prove_same() -> None:
    uri = "data:image/png;base64,iVBORw0KGgo="
    payload = {"prompt": "p", "image": uri}
    for echoed_image in (uri, "https://replicate.delivery/uploads/image.png"):
        listed = entry(input={"prompt": "p", "image": echoed_image})
        assert RULES.match_created(listed, payload, VERSIONED) == "unsure", echoed_image
    nested = {"prompt": "p", "frames": ["https://x/1.png", "DATA:image/png;base64,AA=="]}
    listed = entry(input={"prompt": "p", "frames": ["https://x/1.png", "https://r/2.png"]})
    assert RULES.match_created(listed, nested, VERSIONED) == "unsure"
    # yet another field's difference still proves another
    listed = entry(input={"prompt": "q", "image": uri})
    assert RULES.match_created(listed, payload, VERSIONED) == "other"


def test_an_entry_that_does_not_name_its_model_is_at_most_unsure() -> None:
    no_model = {k: v for k, v in entry().items() if k != "model"}
    assert RULES.match_created(no_model, PAYLOAD, "acme/video") == "unsure"
    assert RULES.match_created(no_model, PAYLOAD, VERSIONED) == "same"  # the version says it
    assert RULES.match_created(entry(version="hidden"), PAYLOAD, VERSIONED) == "unsure"
    assert RULES.match_created({**no_model, "input": {"prompt": "x"}}, PAYLOAD,
                               "acme/video") == "other"


@pytest.mark.parametrize("model", [None, "not a model", "Acme/Video"])
def test_no_create_is_ever_sent_for_a_model_replicate_cannot_take(model: str | None) -> None:
    assert RULES.match_created(entry(), PAYLOAD, model) == "other"


@pytest.mark.parametrize("listed", [None, [], "p1", 3])
def test_a_listed_thing_that_is_no_prediction_is_another(listed: Any) -> None:
    assert RULES.match_created(listed, PAYLOAD, VERSIONED) == "other"


def test_json_equality() -> None:
    assert json_equal({"a": [1, 2.0, None, "x"]}, {"a": [1.0, 2, None, "x"]})
    assert not json_equal([1, 2], [2, 1])
    assert not json_equal({"a": 1}, {"a": 1, "b": 2})
    assert not json_equal(True, 1) and not json_equal(0, False) and json_equal(False, False)
    assert not json_equal(None, 0) and not json_equal("1", 1)
    deep_a: Any = 1
    deep_b: Any = 1
    for _ in range(50_000):
        deep_a, deep_b = [deep_a], [deep_b]
    assert json_equal(deep_a, deep_b)


def test_a_prediction_whose_data_was_removed_has_nothing_to_download() -> None:
    from vidpoll.providers.replicate.rules import RULES as R
    removed = {"status": "succeeded", "output": None, "data_removed": True}
    assert "removed" in (R.result_problem(removed) or "")
    assert R.result_problem({"status": "succeeded", "output": None}) is not None
    assert R.result_problem({"status": "succeeded",
                             "output": "https://replicate.delivery/x/out.mp4"}) is None
    assert R.result_problem(None) is None
