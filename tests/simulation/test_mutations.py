"""Each protocol rule broken on purpose is caught by a history that ``make test`` runs
(``python -m tests.simulation.mutations`` measures how many fresh histories each takes)."""

from __future__ import annotations

import pytest

from tests.simulation.mutations import CAUGHT_BY, MUTATIONS, mutated
from tests.simulation.run import run_seed
from tests.simulation.test_protocol import REGRESSIONS
from tests.simulation.world import PropertyViolated


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_rule_broken_on_purpose_is_caught(mutation: str) -> None:
    history = CAUGHT_BY[mutation]
    assert history in REGRESSIONS
    run_seed(*history)  # the history passes with every rule in place
    with mutated(MUTATIONS[mutation]), pytest.raises(PropertyViolated):
        run_seed(*history)
