"""Forecasters of a model's load: given the recent series, the load ``horizon_s`` ahead.

A series is the work that arrived in each of the last N buckets of ``bucket_s``
seconds (oldest first), as a rate (work per second). Every forecaster is pure and
chosen by name (``make_forecaster``); the benchmark (bench/autoscaler.py) runs them
side by side.

- ``constant``: the mean of the last ``constant_window_s`` (by default the stable
  window), as Dynamo's
  planner's constant predictor and Knative's autoscaler do.
- ``holt``: exponential smoothing with a damped trend (Gardner and McKenzie), fitted
  on the whole history: follows a ramp ahead instead of lagging it by a window, and
  the damping keeps a short spike from extrapolating into a fleet.
- ``trend``: a robust (Theil-Sen) line through the last two minutes: follows a
  sustained ramp as Holt does, and ignores a lone burst that Holt extrapolates.
- ``statsforecast``: AutoETS from Nixtla's statsforecast, when it is installed (not a
  dependency: it pulls numba and its compile time into the service).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec


class Forecaster(Protocol):
    name: str

    def predict(self, series: Sequence[float], bucket_s: float, horizon_s: float) -> float:
        """The rate expected ``horizon_s`` after the end of ``series``; never negative."""
        ...


class ForecastSettings(msgspec.Struct, kw_only=True, frozen=True):
    constant_window_s: float = 0.0
    """constant: the window it averages; 0: the model's stable window."""
    holt_alpha: float = 0.5
    """holt: level smoothing (higher follows the last buckets more)."""
    holt_beta: float = 0.3
    """holt: trend smoothing."""
    holt_phi: float = 0.98
    """holt: trend damping per step (1 is an undamped line)."""
    forecast_step_s: float = 5.0
    """holt, trend, statsforecast: buckets are averaged into steps this long first."""
    trend_window_s: float = 120.0
    """trend: the span its line is fitted on."""


def _steps(series: Sequence[float], bucket_s: float, step_s: float) -> list[float]:
    """Average consecutive buckets into steps of ``step_s``; the last step is the newest
    whole one (a partial oldest step is dropped, the newest never is)."""
    per = max(1, round(step_s / bucket_s))
    out: list[float] = []
    end = len(series)
    while end - per >= 0:
        out.append(sum(series[end - per : end]) / per)
        end -= per
    out.reverse()
    return out


class Constant:
    name = "constant"

    def __init__(self, settings: ForecastSettings) -> None:
        self.window_s = settings.constant_window_s

    def predict(self, series: Sequence[float], bucket_s: float, horizon_s: float) -> float:
        n = max(1, round((self.window_s or 60.0) / bucket_s))
        recent = series[-n:]
        return sum(recent) / len(recent) if recent else 0.0


class Holt:
    name = "holt"

    def __init__(self, settings: ForecastSettings) -> None:
        self.s = settings

    def predict(self, series: Sequence[float], bucket_s: float, horizon_s: float) -> float:
        ys = _steps(series, bucket_s, self.s.forecast_step_s)
        if not ys:
            return 0.0
        if len(ys) == 1:
            return max(0.0, ys[0])
        a, b, phi = self.s.holt_alpha, self.s.holt_beta, self.s.holt_phi
        level, trend = ys[0], ys[1] - ys[0]
        for y in ys[1:]:
            prev = level
            level = a * y + (1 - a) * (prev + phi * trend)
            trend = b * (level - prev) + (1 - b) * phi * trend
        h = max(1, round(horizon_s / self.s.forecast_step_s))
        damped = sum(phi**i for i in range(1, h + 1))
        return max(0.0, level + damped * trend)


class Trend:
    """A robust line through the last ``trend_window_s``: the Theil-Sen slope (the median
    of the slopes between every two steps) and the median intercept. A sustained ramp
    moves most pairs, so the line follows it; one burst moves few, so the line ignores
    it where Holt's trend would extrapolate it (bench/autoscaler.py measures both)."""

    name = "trend"

    def __init__(self, settings: ForecastSettings) -> None:
        self.s = settings

    def predict(self, series: Sequence[float], bucket_s: float, horizon_s: float) -> float:
        ys = _steps(series, bucket_s, self.s.forecast_step_s)[
            -max(2, round(self.s.trend_window_s / self.s.forecast_step_s)) :
        ]
        if len(ys) < 3:
            return Constant(self.s).predict(series, bucket_s, horizon_s)
        slopes = sorted(
            (ys[j] - ys[i]) / (j - i) for i in range(len(ys)) for j in range(i + 1, len(ys))
        )
        slope = slopes[len(slopes) // 2]
        intercepts = sorted(y - slope * x for x, y in enumerate(ys))
        intercept = intercepts[len(intercepts) // 2]
        x = len(ys) - 1 + horizon_s / self.s.forecast_step_s
        return max(0.0, intercept + slope * x)


class StatsForecast:
    """AutoETS from statsforecast (optional): a model chosen by AICc every call."""

    name = "statsforecast"

    def __init__(self, settings: ForecastSettings) -> None:
        try:
            from statsforecast.models import AutoETS
        except ImportError as exc:  # named in the error: the setting asks for it
            raise ValueError(
                "forecaster 'statsforecast' needs the statsforecast package "
                "(pip install statsforecast)"
            ) from exc
        self._model = AutoETS
        self.s = settings

    def predict(self, series: Sequence[float], bucket_s: float, horizon_s: float) -> float:
        import numpy as np

        ys = _steps(series, bucket_s, self.s.forecast_step_s)
        if len(ys) < 8 or max(ys) == min(ys):
            return Constant(self.s).predict(series, bucket_s, horizon_s)
        h = max(1, round(horizon_s / self.s.forecast_step_s))
        fit = self._model(model="ZZN").fit(np.asarray(ys, dtype=float))
        return max(0.0, float(fit.predict(h=h)["mean"][-1]))


FORECASTERS: dict[str, type[Constant] | type[Holt] | type[Trend] | type[StatsForecast]] = {
    "constant": Constant,
    "holt": Holt,
    "trend": Trend,
    "statsforecast": StatsForecast,
}


def make_forecaster(name: str, settings: ForecastSettings | None = None) -> Forecaster:
    try:
        cls = FORECASTERS[name]
    except KeyError:
        raise ValueError(
            f"unknown forecaster {name!r}; choose one of {', '.join(FORECASTERS)}"
        ) from None
    return cls(settings or ForecastSettings())
