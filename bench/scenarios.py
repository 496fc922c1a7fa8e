"""The scenario registry: what is measured, for which systems and N, how often, and how long one
repetition may take. ``plan(quick)`` lists the cases; the harness runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.records import Measurement


@dataclass(frozen=True)
class Case:
    """One (scenario, system, n): ``measure`` is one repetition, bounded by ``cap`` seconds of waiting
    for the system; ``estimate`` is what a repetition may cost in all (setup included), for the budget."""

    scenario: str
    system: str
    n: int
    measure: Callable[[], list[Measurement]]
    repeats: int
    estimate: float
    note: str = ""


@dataclass(frozen=True)
class Mode:
    quick: bool
    repeat: int | None = None  # --repeat: overrides every case's repeats

    def repeats(self, default: int) -> int:
        return self.repeat if self.repeat is not None else default


SCENARIOS = ("ceiling", "burst", "throughput", "scale", "failover")
ALIASES = {"prep_time": "throughput"}


def plan(mode: Mode, names: list[str] | None = None) -> list[Case]:
    """The cases of the named scenarios (all when None), in running order."""
    wanted = [ALIASES.get(name, name) for name in (names or list(SCENARIOS))]
    unknown = sorted(set(wanted) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    builders: dict[str, Callable[[Mode], list[Case]]] = {
        "ceiling": _ceiling,
        "burst": _burst,
        "throughput": _throughput,
        "scale": _scale,
        "failover": _failover,
    }
    return [case for name in SCENARIOS if name in wanted for case in builders[name](mode)]


def _ceiling(mode: Mode) -> list[Case]:
    from bench.ceiling import measure_ceiling

    seconds = 3 if mode.quick else 10
    return [Case("ceiling", "postgres", 1, lambda: measure_ceiling(seconds), mode.repeats(3), seconds + 4.0)]


def _burst(mode: Mode) -> list[Case]:
    from bench import burst_apscheduler, burst_celery, burst_single_loop
    from bench.runplane_scenarios import measure_queuer_burst

    systems: list[tuple[str, Callable[[int, float], list[Measurement]], float]] = [
        # (system, measure(n, cap), seconds of setup per 1,000 jobs)
        ("runplane", measure_queuer_burst, 0.5),
        ("single_loop", burst_single_loop.measure_burst, 0.3),
        ("apscheduler", burst_apscheduler.measure_burst, 0.3),
        ("celery_beat", burst_celery.measure_burst, 0.6),
    ]
    sizes = [(2_000, 3, 45.0)] if mode.quick else [(10_000, 3, 90.0), (100_000, 1, 90.0)]
    cases: list[Case] = []
    for n, repeats, cap in sizes:
        few = "" if repeats >= 3 or mode.repeat else "1 run only: the biggest N, to keep the full run under 15 min"
        for system, measure, setup_per_k in systems:
            cases.append(
                Case(
                    "burst",
                    system,
                    n,
                    _bind(measure, n, cap),
                    mode.repeats(repeats),
                    estimate=10.0 + setup_per_k * n / 1000 + cap / 3,
                    note=few,
                )
            )
    return cases


def _throughput(mode: Mode) -> list[Case]:
    from bench.runplane_scenarios import measure_dispatch

    cap = 90.0 if mode.quick else 240.0

    def measure() -> list[Measurement]:
        split = measure_dispatch(mode.quick, cap)
        return [
            Measurement(m.metric, m.value, m.unit, m.note, scenario=scenario)
            for scenario, measurements in split.items()
            for m in measurements
        ]

    return [Case("throughput", "runplane", 1_000, measure, mode.repeats(3), 40.0 if mode.quick else 90.0)]


def _scale(mode: Mode) -> list[Case]:
    from bench.scale import measure_scale

    n = 100_000 if mode.quick else 1_000_000
    cap = 60.0 if mode.quick else 120.0
    note = "" if mode.repeat else "1 run: each takes minutes"
    return [
        Case("scale", "runplane", n, _bind(measure_scale, n, cap), mode.repeats(1), 20.0 + n * 40e-6 + cap / 2, note)
    ]


def _failover(mode: Mode) -> list[Case]:
    from bench.failover import measure_failover

    n = 300 if mode.quick else 1_000
    minutes_after = 1 if mode.quick else 2

    def measure() -> list[Measurement]:
        return measure_failover(n, cap=60.0, minutes_after=minutes_after)

    note = "" if mode.repeat else "1 run: it waits for minute boundaries"
    return [Case("failover", "runplane", n, measure, mode.repeats(1), 60.0 + 60.0 * minutes_after, note)]


def _bind(measure: Callable[[int, float], list[Measurement]], n: int, cap: float) -> Callable[[], list[Measurement]]:
    return lambda: measure(n, cap)
