"""What a render costs and the caps' windows (vidpoll.spend), pure: estimates by flat price,
model and seconds of output; a provider's figure in money; the day and month a cap counts in
a time zone that is not UTC; every bad price or cap in the accounts file refused at start,
naming the file, the account and the field; tags checked."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from vidpoll.config import read_accounts_file
from vidpoll.errors import ConfigError, InvalidIntent
from vidpoll.providers.base import CURRENCY, Cost
from vidpoll.spend import (
    MAX_TAGS,
    AccountSpend,
    NoEstimate,
    PerSecond,
    check_tags,
    parse_tag,
)

D = Decimal
ENV = {"REP_KEY": "k-rep"}

# --- estimates --------------------------------------------------------------------------------

FLAT = AccountSpend(prices={"default": D("0.50")})
BY_MODEL = AccountSpend(prices={"gen4": D("1.20"), "turbo": D("0.05"), "default": D("0.25")})
ONLY_MODELS = AccountSpend(prices={"gen4": D("1.20")})
PER_SECOND = AccountSpend(prices={"default": PerSecond(D("0.40"),
                                                       "parameters.durationSeconds")})
PER_SECOND_OR_5 = AccountSpend(prices={"default": PerSecond(D("0.40"), "duration", D("5"))})


@pytest.mark.parametrize(("spend", "payload", "model", "expected"), [
    (FLAT, {}, None, D("0.50")),
    (FLAT, {"duration": 10}, "anything", D("0.50")),
    (BY_MODEL, {}, "gen4", D("1.20")),
    (BY_MODEL, {}, "turbo", D("0.05")),
    (BY_MODEL, {}, "other", D("0.25")),  # a model without its own price: `default`
    (BY_MODEL, {}, None, D("0.25")),
    (ONLY_MODELS, {}, "gen4", D("1.20")),
    (PER_SECOND, {"parameters": {"durationSeconds": 8}}, None, D("3.20")),
    (PER_SECOND, {"parameters": {"durationSeconds": 5.5}}, None, D("2.20")),
    (PER_SECOND, {"parameters": {"durationSeconds": "5s"}}, None, D("2.00")),
    (PER_SECOND, {"parameters": {"durationSeconds": " 10 s "}}, None, D("4.00")),
    (PER_SECOND, {"parameters": {"durationSeconds": "8.0"}}, None, D("3.20")),
    (PER_SECOND, {"parameters": {"durationSeconds": 0}}, None, D("0")),
    (PER_SECOND_OR_5, {"duration": 10}, None, D("4.00")),
    (PER_SECOND_OR_5, {}, None, D("2.00")),  # absent: default_seconds
    (PER_SECOND_OR_5, {"duration": "ten"}, None, D("2.00")),  # unreadable: default_seconds
    (PER_SECOND_OR_5, {"duration": True}, None, D("2.00")),
    (PER_SECOND_OR_5, {"duration": -3}, None, D("2.00")),
    (PER_SECOND_OR_5, {"duration": float("nan")}, None, D("2.00")),
    (PER_SECOND_OR_5, {"duration": [5]}, None, D("2.00")),
])
def test_an_estimate_is_the_price_of_the_request(spend: AccountSpend, payload: dict[str, Any],
                                                 model: str | None, expected: Decimal) -> None:
    assert spend.estimate(payload, model) == expected


@pytest.mark.parametrize(("spend", "payload", "model", "words"), [
    (ONLY_MODELS, {}, "turbo", "no price for model 'turbo'"),
    (ONLY_MODELS, {}, None, "no price for requests without a model"),
    (PER_SECOND, {}, None, "no readable `parameters.durationSeconds`"),
    (PER_SECOND, {"parameters": 8}, None, "no readable `parameters.durationSeconds`"),
    (PER_SECOND, {"parameters": {"durationSeconds": "-5s"}}, None, "no readable"),
    (PER_SECOND, {"parameters": {"durationSeconds": "5 minutes"}}, None, "no readable"),
    (PER_SECOND, {"parameters": {"durationSeconds": None}}, None, "no readable"),
])
def test_a_request_a_priced_account_cannot_price_has_no_estimate(
        spend: AccountSpend, payload: dict[str, Any], model: str | None, words: str) -> None:
    with pytest.raises(NoEstimate, match=words.replace("(", r"\(")):
        spend.estimate(payload, model)


def test_an_account_without_prices_estimates_nothing_and_guards_nothing() -> None:
    spend = AccountSpend()
    assert spend.estimate({"duration": 5}, "gen4") is None
    assert (spend.priced, spend.capped, spend.guarded) == (False, False, False)
    assert AccountSpend(max_creates_per_hour=5).guarded
    assert AccountSpend(prices={"default": D(1)}, cap_per_day=D(10)).capped


# --- a provider's figure in money ----------------------------------------------------------------

PRICED = AccountSpend(prices={"default": D("0.50")},
                      unit_prices={"credit": D("0.01"), "predict_second": D("0.0014")})
IN_EUROS = AccountSpend(currency="EUR", unit_prices={"credit": D("0.009")})
BARE = AccountSpend()


@pytest.mark.parametrize(("spend", "cost", "expected"), [
    (PRICED, Cost(D(50), "credit"), D("0.50")),
    (PRICED, Cost(D("12.5"), "predict_second"), D("0.0175")),
    (IN_EUROS, Cost(D(50), "credit"), D("0.450")),
    (BARE, Cost(D(50), "credit"), None),  # a unit the account prices not: recorded only
    (IN_EUROS, Cost(D("12.5"), "predict_second"), None),
    # dollars (Sume's `usd`) are money as they are for an account billed in dollars...
    (PRICED, Cost(D("0.45"), "usd"), D("0.45")),
    (BARE, Cost(D("0.45"), "usd"), D("0.45")),
    # ...never for one in another currency, unless it prices them
    (IN_EUROS, Cost(D("0.45"), "usd"), None),
    (AccountSpend(currency="EUR", unit_prices={"usd": D("0.92")}), Cost(D(2), "usd"),
     D("1.84")),
    # nothing charged is 0 in any unit, known or not
    (BARE, Cost(D(0), "credit"), D(0)),
    (IN_EUROS, Cost(D(0), "usd"), D(0)),
    (PRICED, Cost(D(0), CURRENCY), D(0)),
    (PRICED, Cost(D(3), CURRENCY), None),  # a provider never says which currency it means
])
def test_money_converts_only_units_the_account_prices(spend: AccountSpend, cost: Cost,
                                                      expected: Decimal | None) -> None:
    assert spend.money(cost) == expected


# --- the windows, in the account's time zone ----------------------------------------------------

def at(zone: str, year: int, month: int, day: int, hour: int) -> datetime:
    return datetime(year, month, day, hour, tzinfo=ZoneInfo(zone))


NEW_YORK = AccountSpend(cap_timezone="America/New_York")
TOKYO = AccountSpend(cap_timezone="Asia/Tokyo")


@pytest.mark.parametrize(("spend", "now", "today", "day_end", "month_end"), [
    # 04:30 UTC on New Year's Day is still New Year's Eve in New York: December's month
    # ends at midnight there, in January of the next year
    (NEW_YORK, datetime(2027, 1, 1, 4, 30, tzinfo=UTC), date(2026, 12, 31),
     datetime(2027, 1, 1, 5, tzinfo=UTC), datetime(2027, 1, 1, 5, tzinfo=UTC)),
    (NEW_YORK, datetime(2027, 1, 1, 5, 0, tzinfo=UTC), date(2027, 1, 1),
     datetime(2027, 1, 2, 5, tzinfo=UTC), datetime(2027, 2, 1, 5, tzinfo=UTC)),
    # 16:00 UTC on 30 November is 1 December in Tokyo: the month that ends is December's
    (TOKYO, datetime(2026, 11, 30, 16, 0, tzinfo=UTC), date(2026, 12, 1),
     datetime(2026, 12, 1, 15, tzinfo=UTC), datetime(2026, 12, 31, 15, tzinfo=UTC)),
    (TOKYO, datetime(2026, 12, 31, 14, 59, tzinfo=UTC), date(2026, 12, 31),
     datetime(2026, 12, 31, 15, tzinfo=UTC), datetime(2026, 12, 31, 15, tzinfo=UTC)),
    # the day before summer time begins in New York ends at 05:00 UTC; the day it begins
    # lasts 23 hours and ends at 04:00 UTC
    (NEW_YORK, at("America/New_York", 2026, 3, 7, 12), date(2026, 3, 7),
     datetime(2026, 3, 8, 5, tzinfo=UTC), datetime(2026, 4, 1, 4, tzinfo=UTC)),
    (NEW_YORK, at("America/New_York", 2026, 3, 8, 12), date(2026, 3, 8),
     datetime(2026, 3, 9, 4, tzinfo=UTC), datetime(2026, 4, 1, 4, tzinfo=UTC)),
    # UTC itself, December into January
    (AccountSpend(), datetime(2026, 12, 31, 23, 59, tzinfo=UTC), date(2026, 12, 31),
     datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
])
def test_the_day_and_the_month_turn_at_midnight_where_the_caps_count(
        spend: AccountSpend, now: datetime, today: date, day_end: datetime,
        month_end: datetime) -> None:
    assert spend.today(now) == today
    assert spend.day_end(now) == day_end
    assert spend.month_end(now) == month_end
    # each window's end is the first instant of the next day in the caps' zone
    assert spend.today(spend.day_end(now)) == today + timedelta(days=1)
    assert spend.today(spend.day_end(now) - timedelta(microseconds=1)) == today
    assert spend.today(spend.month_end(now)).day == 1


def test_a_day_that_begins_at_a_skipped_midnight_still_ends_when_the_next_one_begins() -> None:
    # Havana moves its clocks from 00:00 to 01:00 when summer time begins (8 March 2026):
    # that day begins at 01:00 CDT, which is 05:00 UTC. (day_end gives the local midnight
    # that does not exist, 00:00 at the old offset: the right instant, which PostgreSQL and
    # astimezone read by its offset; Python's == across zones calls any time in a gap unequal,
    # hence the conversion before comparing.)
    havana = AccountSpend(cap_timezone="America/Havana")
    end = havana.day_end(at("America/Havana", 2026, 3, 7, 12))
    assert end.astimezone(UTC) == datetime(2026, 3, 8, 5, tzinfo=UTC)
    assert havana.today(end) == date(2026, 3, 8)
    assert havana.today(end - timedelta(microseconds=1)) == date(2026, 3, 7)


# --- the accounts file ------------------------------------------------------------------------

def accounts_file(tmp_path: Path, *lines: str, provider: str = "sume") -> Path:
    path = tmp_path / "accounts.toml"
    path.write_text("\n".join(["[accounts.rep]", f'provider = "{provider}"',
                               'api_key_env = "REP_KEY"', *lines]) + "\n")
    return path


def spend_of(tmp_path: Path, *lines: str, provider: str = "sume") -> AccountSpend:
    path = accounts_file(tmp_path, *lines, provider=provider)
    return read_accounts_file(path, ENV)["rep"].spend


def test_the_documented_settings_are_read_as_exact_decimals(tmp_path: Path) -> None:
    spend = spend_of(tmp_path, "price_per_job = 0.1", "cap_per_day = 10",
                     "cap_per_month = 250.5", 'cap_timezone = "Europe/Paris"',
                     'cap_per_key_prefix = { "order-" = 50 }', "max_creates_per_hour = 500",
                     'currency = "EUR"', "[accounts.rep.unit_prices]", "credit = 0.01")
    assert spend == AccountSpend(currency="EUR", prices={"default": D("0.1")},
                                 unit_prices={"credit": D("0.01")}, cap_per_day=D(10),
                                 cap_per_month=D("250.5"), cap_timezone="Europe/Paris",
                                 cap_per_key_prefix={"order-": D(50)},
                                 max_creates_per_hour=500)


def test_prices_by_model_and_per_second_are_read(tmp_path: Path) -> None:
    spend = spend_of(tmp_path, "cap_per_day = 20", "[accounts.rep.prices]", "default = 0.5",
                     'gen4 = { per_second = 0.40, seconds_field = "duration", '
                     'default_seconds = 5 }',
                     'veo = { per_second = 0.75, seconds_field = "parameters.durationSeconds" }')
    assert spend.prices == {"default": D("0.5"),
                            "gen4": PerSecond(D("0.4"), "duration", D(5)),
                            "veo": PerSecond(D("0.75"), "parameters.durationSeconds")}
    assert spend.estimate({"parameters": {"durationSeconds": "8s"}}, "veo") == D("6.00")


def test_max_creates_per_hour_needs_no_prices_and_an_account_may_set_nothing(
        tmp_path: Path) -> None:
    assert spend_of(tmp_path, "max_creates_per_hour = 1") == AccountSpend(
        max_creates_per_hour=1)
    assert spend_of(tmp_path) == AccountSpend()


PRICE = "price_per_job = 0.5"
PER_S = 'seconds_field = "duration"'

# (what, the lines of [accounts.rep], the field named, words the message must hold)
BAD_SPEND: list[tuple[str, tuple[str, ...], str, str]] = [
    ("a negative price", ("price_per_job = -0.5",), "price_per_job",
     "must be a finite amount 0 or more (like price_per_job = 0.50)"),
    ("a price in quotes", ('price_per_job = "0.50"',), "price_per_job",
     "must be a number without quotes (like price_per_job = 0.50)"),
    ("a price of true", ("price_per_job = true",), "price_per_job",
     "must be a number without quotes"),
    ("a price of nan", ("price_per_job = nan",), "price_per_job", "must be a finite amount"),
    ("a price of inf", ("price_per_job = inf",), "price_per_job", "must be a finite amount"),
    ("a price of -inf", ("price_per_job = -inf",), "price_per_job", "must be a finite amount"),
    ("an absurd price", ("price_per_job = 1e13",), "price_per_job", "must be a finite amount"),
    ("a price as a table", ("price_per_job = { amount = 1 }",), "price_per_job",
     "must be a number without quotes"),
    ("a zero day cap", (PRICE, "cap_per_day = 0"), "cap_per_day",
     "must be a finite amount above 0 (like cap_per_day = 100)"),
    ("a zero month cap", (PRICE, "cap_per_month = 0.0"), "cap_per_month",
     "must be a finite amount above 0"),
    ("a negative day cap", (PRICE, "cap_per_day = -10"), "cap_per_day",
     "must be a finite amount above 0"),
    ("a day cap in quotes", (PRICE, 'cap_per_day = "10"'), "cap_per_day",
     "must be a number without quotes (like cap_per_day = 100)"),
    ("a day cap of true", (PRICE, "cap_per_day = true"), "cap_per_day",
     "must be a number without quotes"),
    ("a day cap of nan", (PRICE, "cap_per_day = nan"), "cap_per_day",
     "must be a finite amount above 0"),
    ("a month cap of inf", (PRICE, "cap_per_month = inf"), "cap_per_month",
     "must be a finite amount above 0"),
    ("an unknown time zone", (PRICE, "cap_per_day = 10", 'cap_timezone = "Mars/Olympus"'),
     "cap_timezone", "unknown time zone 'Mars/Olympus'"),
    ("a time zone as a path", (PRICE, 'cap_timezone = "../../etc/passwd"'), "cap_timezone",
     "unknown time zone"),
    ("an empty time zone", (PRICE, 'cap_timezone = ""'), "cap_timezone", "unknown time zone"),
    ("a time zone as a number", (PRICE, "cap_timezone = 2"), "cap_timezone",
     "must be an IANA time zone's name"),
    ("prices and price_per_job together", (PRICE, "prices = { default = 0.5 }"), "prices",
     "set either price_per_job or [prices]"),
    ("prices as a number", ("prices = 0.5",), "prices", "must be a table of model = price"),
    ("empty prices", ("prices = {}",), "prices", "must be a table of model = price"),
    ("a model's price in quotes", ('prices = { gen4 = "1.20" }',), "prices.gen4",
     "must be a number without quotes (like gen4 = 0.50)"),
    ("a model's negative price", ("prices = { default = -1 }",), "prices.default",
     "must be a finite amount 0 or more"),
    ("a day cap without prices", ("cap_per_day = 10",), "cap_per_day",
     "a cap on spend needs prices (price_per_job, or [accounts.NAME.prices]); without them, "
     "max_creates_per_hour caps the number of creates"),
    ("a month cap without prices", ("cap_per_month = 100",), "cap_per_month",
     "a cap on spend needs prices"),
    ("a prefix cap without prices", ('cap_per_key_prefix = { "order-" = 50 }',),
     "cap_per_key_prefix", "a cap on spend needs prices"),
    ("unit prices alone are no prices", ("cap_per_day = 10", "unit_prices = { credit = 0.01 }"),
     "cap_per_day", "a cap on spend needs prices"),
    ("a unit Sume does not report", (PRICE, "unit_prices = { predict_second = 0.0014 }"),
     "unit_prices.predict_second",
     "not a cost unit of this provider (its units: credit, usd)"),
    ("unit prices as a number", (PRICE, "unit_prices = 0.01"), "unit_prices",
     "must be a table of unit = price"),
    ("a negative unit price", (PRICE, "unit_prices = { credit = -0.01 }"),
     "unit_prices.credit", "must be a finite amount 0 or more"),
    ("a unit price in quotes", (PRICE, 'unit_prices = { credit = "0.01" }'),
     "unit_prices.credit", "must be a number without quotes"),
    ("a seconds_field with a space", ('prices.default = { per_second = 0.4, '
                                      'seconds_field = "duration seconds" }',),
     "prices.default.seconds_field", "must be a dotted path into the request body"),
    ("a seconds_field with an empty part", ('prices.default = { per_second = 0.4, '
                                            'seconds_field = "parameters..seconds" }',),
     "prices.default.seconds_field", "must be a dotted path"),
    ("a seconds_field as a number", ("prices.default = { per_second = 0.4, "
                                     "seconds_field = 5 }",),
     "prices.default.seconds_field", "must be a dotted path"),
    ("an unknown field in a per-second price",
     (f"prices.default = {{ per_second = 0.4, {PER_S}, per_minute = 20 }}",),
     "prices.default.per_minute",
     "unknown field (allowed: per_second, seconds_field, default_seconds)"),
    ("a per-second price without seconds_field", ("prices.default = { per_second = 0.4 }",),
     "prices.default", "a price per second names per_second and seconds_field"),
    ("a per-second price without per_second", (f"prices.default = {{ {PER_S} }}",),
     "prices.default", "a price per second names per_second and seconds_field"),
    ("a negative per_second", (f"prices.default = {{ per_second = -0.4, {PER_S} }}",),
     "prices.default.per_second", "must be a finite amount 0 or more"),
    ("default_seconds in quotes",
     (f'prices.gen4 = {{ per_second = 0.4, {PER_S}, default_seconds = "5s" }}',),
     "prices.gen4.default_seconds", "must be a number without quotes"),
    ("default_seconds of nan",
     (f"prices.gen4 = {{ per_second = 0.4, {PER_S}, default_seconds = nan }}",),
     "prices.gen4.default_seconds", "must be a finite amount"),
    ("an empty key prefix", (PRICE, 'cap_per_key_prefix = { "" = 50 }'),
     "cap_per_key_prefix", "a prefix may not be empty"),
    ("a zero prefix cap", (PRICE, 'cap_per_key_prefix = { "order-" = 0 }'),
     "cap_per_key_prefix.order-", "must be a finite amount above 0"),
    ("a prefix cap as a number", (PRICE, "cap_per_key_prefix = 50"), "cap_per_key_prefix",
     "must be a table of key prefix = a day's cap"),
    ("max_creates_per_hour of 0", ("max_creates_per_hour = 0",), "max_creates_per_hour",
     "must be a whole number of creates from 1, without quotes"),
    ("max_creates_per_hour of 1.5", ("max_creates_per_hour = 1.5",), "max_creates_per_hour",
     "must be a whole number of creates from 1"),
    ("max_creates_per_hour negative", ("max_creates_per_hour = -3",), "max_creates_per_hour",
     "must be a whole number"),
    ("max_creates_per_hour in quotes", ('max_creates_per_hour = "500"',),
     "max_creates_per_hour", "must be a whole number"),
    ("max_creates_per_hour of true", ("max_creates_per_hour = true",),
     "max_creates_per_hour", "must be a whole number"),
    ("a currency of words", (PRICE, 'currency = "US dollars"'), "currency",
     "must be a currency's code"),
    ("a currency as a number", (PRICE, "currency = 840"), "currency",
     "must be a currency's code"),
    ("an empty currency", (PRICE, 'currency = ""'), "currency", "must be a currency's code"),
    ("prices by model where creates name none",
     ("cap_per_day = 10", "[accounts.rep.prices]", "gen4 = 0.5"), "prices",
     "this provider's creates name no model, so only a `default` price applies"),
]


@pytest.mark.parametrize(("lines", "field", "words"), [c[1:] for c in BAD_SPEND],
                         ids=[c[0] for c in BAD_SPEND])
def test_a_bad_price_or_cap_is_refused_naming_the_file_the_account_and_the_field(
        tmp_path: Path, lines: tuple[str, ...], field: str, words: str) -> None:
    path = accounts_file(tmp_path, *lines)
    with pytest.raises(ConfigError) as caught:
        read_accounts_file(path, ENV)
    message = str(caught.value)
    assert "\n" not in message, message
    assert message.startswith(f"{path}: [accounts.rep] {field}: "), message
    assert words in message, message


def test_a_provider_that_reports_no_cost_has_no_unit_to_price(tmp_path: Path) -> None:
    path = accounts_file(tmp_path, PRICE, "unit_prices = { credit = 0.01 }", provider="fal")
    with pytest.raises(ConfigError) as caught:
        read_accounts_file(path, ENV)
    assert str(caught.value) == (f"{path}: [accounts.rep] unit_prices.credit: not a cost unit "
                                 f"of this provider (its units: none: it reports no cost "
                                 f"figure)")


def test_replicate_prices_its_predict_seconds(tmp_path: Path) -> None:
    spend = spend_of(tmp_path, PRICE, "unit_prices = { predict_second = 0.0014 }",
                     provider="replicate")
    assert spend.money(Cost(D(10), "predict_second")) == D("0.0140")


# --- tags -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("tags", "words"), [
    ({f"t{n}": "x" for n in range(MAX_TAGS + 1)}, "at most 20 tags per request, not 21"),
    ({"": "x"}, "tag name ''"),
    ({"-team": "x"}, "tag name '-team'"),
    ({"team name": "x"}, "tag name 'team name'"),
    ({"é": "x"}, "tag name"),
    ({"t" * 65: "x"}, "64 at most"),
    ({5: "x"}, "tag name '5'"),
    ({"team": "x" * 201}, "tag team: its value must be printable text of 200 characters"),
    ({"team": "a\nb"}, "tag team: its value must be printable"),
    ({"team": "a\x1b[31m"}, "tag team: its value must be printable"),
    ({"team": 5}, "tag team: its value must be printable"),
    ({"team": None}, "tag team: its value must be printable"),
])
def test_bad_tags_are_refused(tags: dict[Any, Any], words: str) -> None:
    with pytest.raises(InvalidIntent) as caught:
        check_tags(tags)
    assert words in str(caught.value)


def test_good_tags_are_kept_and_none_is_none() -> None:
    most = {f"t{n}": "x" for n in range(MAX_TAGS)}
    assert check_tags(most) == most
    longest = {"t" * 64: "v" * 200, "a.b:c-d_e": "", "9lives": "café ☕"}
    assert check_tags(longest) == longest
    assert check_tags(None) is None and check_tags({}) is None


@pytest.mark.parametrize(("text", "expected"), [
    ("team=video", ("team", "video")),
    ("team=a=b", ("team", "a=b")),
    ("team=", ("team", "")),
])
def test_a_tag_is_name_equals_value(text: str, expected: tuple[str, str]) -> None:
    assert parse_tag(text) == expected


@pytest.mark.parametrize("text", ["team", "=video", "", "="])
def test_a_tag_without_a_name_and_an_equals_sign_is_refused(text: str) -> None:
    with pytest.raises(InvalidIntent, match="write it as name=value"):
        parse_tag(text)


def test_doctor_says_what_each_account_knows_of_its_costs() -> None:
    from vidpoll.doctor import OK, spend_findings

    found = {f.check: f for f in spend_findings({
        "plain": (AccountSpend(), {"credit": "Sume credits"}),
        "guarded": (AccountSpend(max_creates_per_hour=50), {}),
        "capped": (AccountSpend(prices={"default": D("0.5")}, cap_per_day=D(10),
                                unit_prices={"credit": D("0.01")}),
                   {"credit": "Sume credits", "usd": "US dollars"}),
        "uncovered": (AccountSpend(currency="EUR", prices={"default": D(1)}),
                      {"credit": "Sume credits"})})}
    assert {f.status for f in found.values()} == {OK}
    assert found["spend: plain"].detail == ("no prices: its jobs have no estimate and no spend "
                                            "cap")
    assert "max_creates_per_hour 50 caps its creates" in found["spend: guarded"].detail
    assert found["spend: capped"].detail == "priced in USD; caps: cap_per_day 10 USD"
    assert found["spend: capped"].fix == ""  # `usd` is money on a USD account
    assert "credit figures are recorded but not converted" in found["spend: uncovered"].detail
    assert "unit_prices] credit" in found["spend: uncovered"].fix
