"""The click types of every numeric option (and so of its config key and environment
variable): finite, within a range, and a bad value is one usage-error line (exit 2;
14 from a config file). Python's float() takes "nan", "inf" and "1e308", which
click's own FloatRange lets through (nan compares false with both bounds)."""

from __future__ import annotations

import math
from typing import Any, Optional

import click

# The agent takes lock timeouts and leases as int32 milliseconds; a bound well inside that.
MAX_SECONDS = 1_000_000.0   # about 11.5 days
MAX_COUNT = 1_000_000


class Seconds(click.FloatRange):
    """A finite number of seconds in [min, max]."""

    name = "seconds"

    def __init__(self, min: float, max: float = MAX_SECONDS) -> None:
        super().__init__(min=min, max=max)

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        number = _finite(self, value, param, ctx)
        return super().convert(number, param, ctx)


class Count(click.IntRange):
    """A whole number in [min, max]."""

    name = "count"

    def __init__(self, min: int, max: int = MAX_COUNT) -> None:
        super().__init__(min=min, max=max)

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if isinstance(value, float) or (isinstance(value, str) and not value.strip().lstrip("+-").isdigit()):
            number = _finite(self, value, param, ctx)  # a config file may say 3.0; never 3.5 or nan
            if not number.is_integer():
                self.fail(f"{value!r} is not a whole number", param, ctx)
            value = int(number)
        elif isinstance(value, bool):
            self.fail(f"{value!r} is not a number", param, ctx)
        return super().convert(value, param, ctx)


class Size(click.types.StringParamType):
    """A byte size such as 4G or 512M (kept as written; checked here so a config file is too)."""

    name = "size"

    def __init__(self, max: int = 1 << 50) -> None:
        self.max = max

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        from .platform.simdaemon import parse_size

        try:
            size = parse_size(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if size > self.max:
            self.fail(f"{value!r} is more than {self.max >> 40} TiB", param, ctx)
        return str(value)


def _finite(kind: "click.FloatRange | click.IntRange", value: Any, param: Optional[click.Parameter],
            ctx: Optional[click.Context]) -> float:
    if isinstance(value, bool):
        kind.fail(f"{value!r} is not a number", param, ctx)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        kind.fail(f"{value!r} is not a number", param, ctx)
    if not math.isfinite(number):
        kind.fail(f"{value!r} is not a finite number", param, ctx)
    return number
