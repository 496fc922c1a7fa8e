"""The scenario registry: what is measured, for which systems and N, how often, and how long one
repetition may take. ``plan(quick)`` lists the cases; the harness runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.records import Measurement


@dataclass(frozen=True)
class Case:
    """One (scenario, system, n): ``measure`` is one repetition, bounded by a cap on the time it
    waits for the system; ``estimate`` is what a repetition usually takes in all (setup and cleanup
    included), so that the harness does not start one the time budget cannot hold."""

    scenario: str
    system: str
    n: int
    measure: Callable[[], list[Measurement]]
    repeats: int
    estimate: float
    note: str = ""
    check: Callable[[], None] = lambda: None  # raises Unavailable when the case cannot run here
    late: bool = False  # run after the others in each round: first to go when the budget is short
    # For a case that measures at a real minute boundary (cron has minute resolution): the seconds
    # from its start that it needs before that boundary. The harness starts it about that long
    # before one, and runs other cases in the meantime rather than let it wait.
    minute_lead: float | None = None


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
    from bench.ceiling import measure_ceiling, require_pgbench

    seconds = 2 if mode.quick else 5
    return [
        Case(
            "ceiling",
            "postgres",
            1,
            lambda: measure_ceiling(seconds),
            mode.repeats(3),
            estimate=seconds + 5.0,
            check=require_pgbench,
        )
    ]


def _burst(mode: Mode) -> list[Case]:
    from bench import burst_apscheduler, burst_celery, burst_single_loop, runplane_scenarios

    # N, repeats, and per system the cap on waiting for it. runplane's covers its whole run: its
    # services read the real clock, so it waits for a real minute boundary after its setup.
    sizes: list[tuple[int, int, dict[str, float]]] = (
        [(2_000, 3, {"runplane": 150.0, "single_loop": 30.0, "apscheduler": 30.0, "celery_beat": 8.0})]
        if mode.quick
        else [
            (10_000, 3, {"runplane": 180.0, "single_loop": 60.0, "apscheduler": 60.0, "celery_beat": 30.0}),
            (100_000, 1, {"runplane": 300.0, "single_loop": 40.0, "apscheduler": 90.0, "celery_beat": 30.0}),
        ]
    )
    cases: list[Case] = []
    for n, repeats, caps in sizes:
        few = "" if repeats >= 3 or mode.repeat else "1 run only: the largest N, to keep the full run under 15 min"
        cases += [
            Case(
                "burst",
                "runplane",
                n,
                _bind(runplane_scenarios.measure_queuer_burst, n, caps["runplane"]),
                mode.repeats(repeats),
                # Started that long before a minute boundary: the queuing and the stop follow it.
                estimate=runplane_scenarios.queuer_burst_lead(n) + 5.0 + n / 20_000,
                note=few,
                late=n >= 100_000,
                check=runplane_scenarios.require_queuer_burst,
                minute_lead=runplane_scenarios.queuer_burst_lead(n),
            ),
            Case(
                "burst",
                "single_loop",
                n,
                _bind(burst_single_loop.measure_burst, n, caps["single_loop"]),
                mode.repeats(repeats),
                # It queues some 1,000 runs a second here, one INSERT each.
                estimate=burst_single_loop.lead_time(n) + min(n * 1e-3, caps["single_loop"]) + 10.0,
                note=few,
                late=n >= 100_000,
            ),
            Case(
                "burst",
                "apscheduler",
                n,
                _bind(burst_apscheduler.measure_burst, n, caps["apscheduler"]),
                mode.repeats(repeats),
                estimate=burst_apscheduler.lead_time(n) + min(n * 0.3e-3, caps["apscheduler"]) + 10.0,
                note=few,
                late=n >= 100_000,
            ),
            Case(
                "burst",
                "celery_beat",
                n,
                _bind(burst_celery.measure_burst, n, caps["celery_beat"]),
                mode.repeats(repeats),
                # Beat sends fewer than 100 tasks a second once it holds thousands of entries.
                estimate=burst_celery.lead_time(n) + min(n * 15e-3, caps["celery_beat"]) + 15.0,
                note=few,
                late=n >= 100_000,
            ),
        ]
    return cases


def _throughput(mode: Mode) -> list[Case]:
    """Throughput (noop launcher, repeated) and prep time (local launcher, one steady minute)."""
    from bench import runplane_scenarios

    def measure(part: str, cap: float) -> Callable[[], list[Measurement]]:
        return lambda: runplane_scenarios.measure_dispatch(mode.quick, cap, part)

    steady = 15.0 if mode.quick else 60.0
    return [
        Case(
            "throughput",
            "runplane",
            1_000,
            measure("throughput", 90.0),
            mode.repeats(3),
            estimate=25.0,
            check=runplane_scenarios.require_dispatch_throughput,
        ),
        Case(
            "prep_time",
            "runplane",
            1_000,
            measure("prep_time", steady + 60.0),
            mode.repeats(1 if not mode.quick else 3),
            estimate=steady + 12.0,
            note="" if mode.quick or mode.repeat else "1 run: a steady minute at 10 runs/s",
            check=runplane_scenarios.require_dispatch_throughput,
        ),
    ]


def _scale(mode: Mode) -> list[Case]:
    from bench import scale

    n = 100_000 if mode.quick else 1_000_000
    cap = 60.0 if mode.quick else 120.0
    assign = n / 15_000  # what assigning takes here, about
    return [
        Case(
            "scale",
            "runplane",
            n,
            _bind(scale.measure_scale, n, cap),
            mode.repeats(1),
            estimate=scale.setup_time(n) + assign + 5.0,
            note="" if mode.repeat else "1 run: each takes minutes",
            check=scale.require,
        )
    ]


def _failover(mode: Mode) -> list[Case]:
    from bench import failover

    n = 300 if mode.quick else 1_000
    minutes_after = 1

    def measure() -> list[Measurement]:
        return failover.measure_failover(n, minutes_after=minutes_after)

    return [
        Case(
            "failover",
            "runplane",
            n,
            measure,
            mode.repeats(1),
            estimate=failover.expected_duration(minutes_after),
            note="" if mode.repeat else "1 run: it waits for minute boundaries",
            check=failover.require,
            minute_lead=failover.MINUTE_LEAD,
        )
    ]


def _bind(measure: Callable[[int, float], list[Measurement]], n: int, cap: float) -> Callable[[], list[Measurement]]:
    return lambda: measure(n, cap)
