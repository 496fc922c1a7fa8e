"""Which entries of the node's packages cache go when it is over its budget: least recently used first."""

from __future__ import annotations

from pathlib import Path

from runner.cache_budget import CacheBudget, Entry, to_evict


def test_the_least_recently_used_go_first_until_the_rest_fits_never_the_new_one() -> None:
    old, mid, new = Entry(Path("/c/1/old"), 40, 1.0), Entry(Path("/c/2/mid"), 40, 2.0), Entry(Path("/c/1/new"), 40, 3.0)
    assert to_evict([new, old, mid], budget=120, keep=new.path) == []
    assert to_evict([new, old, mid], budget=100, keep=new.path) == [old.path]
    assert to_evict([new, old, mid], budget=40, keep=new.path) == [old.path, mid.path]
    # The new entry alone above the budget stays: it was just made for a run.
    assert to_evict([new, old, mid], budget=10, keep=new.path) == [old.path, mid.path]
    # The oldest is the one kept: the next ones go instead.
    assert to_evict([new, old, mid], budget=80, keep=old.path) == [mid.path]


def _entry(root: Path, account: int, key: str, size: int) -> Path:
    path = root / str(account) / key
    (path / "tree").mkdir(parents=True)
    (path / "tree" / "m.sql").write_bytes(b"x" * size)
    return path


def test_a_budget_reads_the_entries_on_disk_and_removes_what_no_longer_fits(tmp_path: Path) -> None:
    root = tmp_path / "node"
    first, second = _entry(root, 1, "a" * 64, 600), _entry(root, 2, "b" * 64, 600)
    (root / "1" / ".staging-x").mkdir()  # a store in progress is no entry
    budget = CacheBudget(root, 1500)
    assert budget.total == 1200
    budget.restored(first)  # the first is now the most recently used

    third = _entry(root, 1, "c" * 64, 600)
    assert budget.stored(third) == [second]
    assert not second.exists() and first.exists() and third.exists()
    assert budget.total == 1200
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # nothing left of the removal
    assert CacheBudget(root, 0).stored(third) == []  # no budget: nothing is ever removed
