"""What a render costs, and the caps an account's creates obey (issue 30). Pure: no I/O.

An account's `[accounts.NAME]` table may price its renders (a flat `price_per_job`, or
`[accounts.NAME.prices]` by model, each a number or a price per second of output read from
the request body), convert the provider's own cost figures (`[accounts.NAME.unit_prices]`:
Sume's and Runway's credits, Replicate's predict seconds) and cap what its creates may spend
(`cap_per_day`, `cap_per_month`, calendar windows in `cap_timezone`; `cap_per_key_prefix`, a
day's cap for keys that start with a prefix) or how many it sends (`max_creates_per_hour`,
with or without prices). `AccountSpend` holds them; `parse_account_spend` reads them from the
table, every mistake a ConfigError naming the account and the field.

The caps are enforced in PostgreSQL (vidpoll.store.spend): every create reserves its estimate
in the transaction that claims it, under the account's lock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from vidpoll.errors import ConfigError, InvalidIntent
from vidpoll.models import Intent
from vidpoll.providers.base import CURRENCY, Cost

SPEND_FIELDS = ("currency", "price_per_job", "prices", "unit_prices", "cap_per_day",
                "cap_per_month", "cap_timezone", "cap_per_key_prefix", "max_creates_per_hour")
"""The fields of an `[accounts.NAME]` table this module reads (any provider)."""

DEFAULT_CURRENCY = "USD"
WARN_AT = Decimal("0.8")
"""The share of a cap at which a warning is logged, once per window."""
MAX_AMOUNT = Decimal("1e12")
_CURRENCY = re.compile(r"[A-Za-z][A-Za-z0-9]{0,9}")
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,7}")
_SECONDS_TEXT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*s?\s*")


@dataclass(frozen=True)
class PerSecond:
    """A price per second of output, the seconds read from the request body."""

    per_second: Decimal
    seconds_field: str
    """A dotted path into the request body (`parameters.durationSeconds`)."""
    default_seconds: Decimal | None = None
    """When the body has no such field; None: such a request has no estimate."""


Price = Decimal | PerSecond


class NoEstimate(ValueError):
    """Why a request has no estimate (its model has no price, its seconds are unreadable)."""


@dataclass(frozen=True)
class AccountSpend:
    """One account's prices and caps; the defaults: no price, no cap."""

    currency: str = DEFAULT_CURRENCY
    prices: Mapping[str, Price] = field(default_factory=dict)
    """By model, or `default` (what `price_per_job` sets)."""
    unit_prices: Mapping[str, Decimal] = field(default_factory=dict)
    """The account's price of one of the provider's cost units (`Provider.cost_units`)."""
    cap_per_day: Decimal | None = None
    cap_per_month: Decimal | None = None
    cap_timezone: str = "UTC"
    cap_per_key_prefix: Mapping[str, Decimal] = field(default_factory=dict)
    """A day's cap for the keys that start with each prefix."""
    max_creates_per_hour: int | None = None

    @property
    def priced(self) -> bool:
        return bool(self.prices)

    @property
    def capped(self) -> bool:
        """Whether any cap on money applies (then a request must have an estimate)."""
        return (self.cap_per_day is not None or self.cap_per_month is not None
                or bool(self.cap_per_key_prefix))

    @property
    def guarded(self) -> bool:
        """Whether creates reserve anything at all before they are sent."""
        return self.priced or self.capped or self.max_creates_per_hour is not None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.cap_timezone)

    def estimate(self, payload: Mapping[str, Any], model: str | None) -> Decimal | None:
        """What a request is expected to cost; None for an account without prices. Raises
        NoEstimate when it has prices but none for this request."""
        if not self.prices:
            return None
        price = self.prices.get(model or "") if model else None
        if price is None:
            price = self.prices.get("default")
        if price is None:
            named = f"model {model!r}" if model else "requests without a model"
            raise NoEstimate(f"no price for {named} (add it, or `default`, to the account's "
                             f"prices)")
        if isinstance(price, Decimal):
            return price
        seconds = _seconds(payload, price.seconds_field)
        if seconds is None:
            if price.default_seconds is None:
                raise NoEstimate(f"the request has no readable `{price.seconds_field}` and "
                                 f"the price names no default_seconds")
            seconds = price.default_seconds
        return price.per_second * seconds

    def money(self, cost: Cost) -> Decimal | None:
        """A provider's figure in the account's currency; None when its unit has no price
        here (the figure is then recorded, never mixed into money)."""
        if cost.amount == 0:
            return Decimal(0)
        if cost.unit == CURRENCY:
            return None  # a provider never says which currency: only 0 is money as it is
        if cost.unit == self.currency.lower() and cost.unit not in self.unit_prices:
            return cost.amount  # a figure in the account's own currency (Sume's `usd`)
        unit_price = self.unit_prices.get(cost.unit)
        return None if unit_price is None else cost.amount * unit_price

    def today(self, now: datetime) -> date:
        """The calendar day of `now` in cap_timezone."""
        return now.astimezone(self.zone).date()

    def day_end(self, now: datetime) -> datetime:
        """When the day of `now` ends in cap_timezone (the day cap's window turns)."""
        day = self.today(now) + timedelta(days=1)
        return datetime.combine(day, time(), self.zone)

    def month_end(self, now: datetime) -> datetime:
        day = self.today(now)
        first = date(day.year + (day.month == 12), day.month % 12 + 1, 1)
        return datetime.combine(first, time(), self.zone)


NO_SPEND = AccountSpend()


def month_start(day: date) -> date:
    return day.replace(day=1)


def prefixes_of(key: str, spend: AccountSpend) -> list[str]:
    """The capped prefixes a key starts with."""
    return [p for p in spend.cap_per_key_prefix if key.startswith(p)]


def _seconds(payload: Mapping[str, Any], path: str) -> Decimal | None:
    """The number at a dotted path of the body: a number, or text like "5", "5s", "8.0"."""
    value: Any = payload
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            return None
        return Decimal(str(value))
    if isinstance(value, str):
        match = _SECONDS_TEXT.fullmatch(value)
        return Decimal(match.group(1)) if match else None
    return None


# --- the accounts file ------------------------------------------------------------------------

def parse_account_spend(at: str, table: Mapping[str, Any],
                        units: Mapping[str, str] | None = None,
                        takes_model: bool = True) -> AccountSpend:
    """The spend fields of one `[accounts.NAME]` table (`at` names it in every error);
    `units`: the provider's cost units (`Provider.cost_units`); `takes_model`: whether its
    creates name a model (else only a `default` price can ever apply)."""
    currency = table.get("currency", DEFAULT_CURRENCY)
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise ConfigError(f"{at} currency: must be a currency's code (like currency = \"USD\")")
    prices: dict[str, Price] = {}
    flat = table.get("price_per_job")
    if flat is not None:
        prices["default"] = _amount(at, "price_per_job", flat, "price_per_job = 0.50")
    named = table.get("prices")
    if named is not None:
        if flat is not None:
            raise ConfigError(f"{at} prices: set either price_per_job or [prices] (with a "
                              f"`default` entry for every other model), not both")
        if not isinstance(named, dict) or not named:
            raise ConfigError(f"{at} prices: must be a table of model = price (like "
                              f"[accounts.NAME.prices] with default = 0.50)")
        for model, price in named.items():
            prices[model] = _price(at, f"prices.{model[:64]}", price)
        if not takes_model and "default" not in prices:
            raise ConfigError(f"{at} prices: this provider's creates name no model, so only "
                              f"a `default` price applies (or use price_per_job)")
    unit_prices: dict[str, Decimal] = {}
    given = table.get("unit_prices")
    if given is not None:
        if not isinstance(given, dict):
            raise ConfigError(f"{at} unit_prices: must be a table of unit = price (like "
                              f"[accounts.NAME.unit_prices] with credit = 0.01)")
        known = dict(units or {})
        for unit, price in given.items():
            if unit not in known:
                listed = ", ".join(sorted(known)) or "none: it reports no cost figure"
                raise ConfigError(f"{at} unit_prices.{unit[:64]}: not a cost unit of this "
                                  f"provider (its units: {listed})")
            unit_prices[unit] = _amount(at, f"unit_prices.{unit}", price, f"{unit} = 0.01")
    caps = {name: (None if table.get(name) is None
                   else _amount(at, name, table[name], f"{name} = 100", positive=True))
            for name in ("cap_per_day", "cap_per_month")}
    zone = table.get("cap_timezone", "UTC")
    if not isinstance(zone, str):
        raise ConfigError(f"{at} cap_timezone: must be an IANA time zone's name (like "
                          f"cap_timezone = \"Europe/Paris\")")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{at} cap_timezone: unknown time zone {zone[:64]!r} (an IANA "
                          f"name, like \"UTC\" or \"America/New_York\")") from None
    by_prefix: dict[str, Decimal] = {}
    given = table.get("cap_per_key_prefix")
    if given is not None:
        if not isinstance(given, dict) or not given:
            raise ConfigError(f"{at} cap_per_key_prefix: must be a table of key prefix = a "
                              f"day's cap (like cap_per_key_prefix = {{ \"order-\" = 50 }})")
        for prefix, cap in given.items():
            if not prefix:
                raise ConfigError(f"{at} cap_per_key_prefix: a prefix may not be empty (use "
                                  f"cap_per_day for the whole account)")
            by_prefix[prefix] = _amount(at, f"cap_per_key_prefix.{prefix[:64]}", cap,
                                        f"\"{prefix[:16]}\" = 50", positive=True)
    hourly = table.get("max_creates_per_hour")
    if hourly is not None and (isinstance(hourly, bool) or not isinstance(hourly, int)
                               or not 1 <= hourly <= 10_000_000):
        raise ConfigError(f"{at} max_creates_per_hour: must be a whole number of creates "
                          f"from 1, without quotes (like max_creates_per_hour = 500)")
    spend = AccountSpend(currency, prices, unit_prices, caps["cap_per_day"],
                         caps["cap_per_month"], zone, by_prefix, hourly)
    if spend.capped and not spend.priced:
        first = next(n for n in ("cap_per_day", "cap_per_month", "cap_per_key_prefix")
                     if table.get(n) is not None)
        raise ConfigError(f"{at} {first}: a cap on spend needs prices (price_per_job, or "
                          f"[accounts.NAME.prices]); without them, max_creates_per_hour caps "
                          f"the number of creates")
    return spend


def _amount(at: str, name: str, value: Any, example: str, *,
            positive: bool = False) -> Decimal:
    """A decimal amount of money from the file: a number without quotes, finite, >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{at} {name}: must be a number without quotes (like {example})")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        amount = Decimal("NaN")
    if not amount.is_finite() or amount < 0 or amount > MAX_AMOUNT or (positive
                                                                       and amount == 0):
        least = "above 0" if positive else "0 or more"
        raise ConfigError(f"{at} {name}: must be a finite amount {least} (like {example})")
    return amount


def _price(at: str, name: str, value: Any) -> Price:
    """One entry of [prices]: a number, or {per_second, seconds_field, default_seconds}."""
    if not isinstance(value, dict):
        return _amount(at, name, value, f"{name.split('.', 1)[-1]} = 0.50")
    allowed = ("per_second", "seconds_field", "default_seconds")
    for key in value:
        if key not in allowed:
            raise ConfigError(f"{at} {name}.{key[:64]}: unknown field (allowed: "
                              f"{', '.join(allowed)})")
    if "per_second" not in value or "seconds_field" not in value:
        raise ConfigError(f"{at} {name}: a price per second names per_second and "
                          f"seconds_field (like {{ per_second = 0.40, seconds_field = "
                          f"\"duration\", default_seconds = 5 }})")
    per_second = _amount(at, f"{name}.per_second", value["per_second"], "per_second = 0.40")
    path = value["seconds_field"]
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise ConfigError(f"{at} {name}.seconds_field: must be a dotted path into the request "
                          f"body (like seconds_field = \"parameters.durationSeconds\")")
    default = value.get("default_seconds")
    return PerSecond(per_second, path,
                     None if default is None else
                     _amount(at, f"{name}.default_seconds", default, "default_seconds = 5"))


# --- tags and held intents ------------------------------------------------------------------

MAX_TAGS = 20
_TAG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def check_tags(tags: Mapping[str, str] | None) -> dict[str, str] | None:
    """`submit --tag name=value` (or the API's `tags`), checked: at most 20, each name a
    word of letters, digits, '_', '.', ':' or '-' (64 at most), each value printable text of
    200 characters at most. None when there are none. Raises InvalidIntent."""
    if not tags:
        return None
    if len(tags) > MAX_TAGS:
        raise InvalidIntent(f"at most {MAX_TAGS} tags per request, not {len(tags)}")
    checked: dict[str, str] = {}
    for name, value in tags.items():
        if not isinstance(name, str) or not _TAG_NAME.fullmatch(name):
            raise InvalidIntent(f"tag name {str(name)[:64]!r}: letters, digits, '_', '.', ':' "
                                f"or '-', starting with a letter or digit, 64 at most")
        if (not isinstance(value, str) or len(value) > 200
                or not all(c.isprintable() for c in value)):
            raise InvalidIntent(f"tag {name}: its value must be printable text of 200 "
                                f"characters at most")
        checked[name] = value
    return checked


def parse_tag(text: str) -> tuple[str, str]:
    """One `--tag name=value`."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise InvalidIntent(f"--tag {text[:64]!r}: write it as name=value")
    return name, value


def held_reason(intent: Intent) -> str:
    """Why a held intent waits, and what an operator can do about it."""
    why = intent.held_reason or "a spend cap holds it"
    return (f"held, not sent: {why}. `vidpoll intents release {intent.key}` sends it past the "
            f"cap")
