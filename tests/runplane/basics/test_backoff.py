"""The one backoff formula: doubling to a cap, jitter in the upper half, for any number of attempts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runplane.adapters.outages import Backoff
from runplane.basics.backoff import ceiling, jittered

firsts = st.floats(min_value=0.001, max_value=3600)
caps = st.floats(min_value=0.001, max_value=86_400)
# Attempts past a thousand come from counters nothing bounds (a delivery retried for weeks, an outage
# that lasts): 2**1100 seconds no longer fits a float.
attempts = st.integers(min_value=1, max_value=10**6)


def test_the_ceiling_doubles_from_the_first_wait_to_the_cap() -> None:
    assert [ceiling(1.0, attempt, cap=30.0) for attempt in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


@given(firsts, attempts, caps)
def test_a_wait_is_in_the_upper_half_of_its_ceiling(first: float, attempt: int, cap: float) -> None:
    top = ceiling(first, attempt, cap=cap)
    assert top <= cap
    assert top / 2 <= jittered(first, attempt, cap=cap) <= top


def test_an_outage_backs_off_with_the_same_formula_however_long_it_lasts() -> None:
    backoff = Backoff(first=0.5, cap=10.0)
    waits = [backoff.next() for _ in range(2000)]
    assert 0.25 <= waits[0] <= 0.5
    assert all(5.0 <= wait <= 10.0 for wait in waits[10:])
    backoff.reset()
    assert backoff.next() <= 0.5
