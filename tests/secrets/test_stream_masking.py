"""Masking a stream of output: a secret split across pieces is masked as if the text came whole."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from runner.run_logs import StreamMasker
from runplane.basics.secrets import mask

_TEXT = st.text(alphabet="abcs3*-\n", max_size=60)


@given(
    secrets=st.lists(st.text(alphabet="abcs3-", min_size=1, max_size=8), max_size=3),
    text=_TEXT,
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6),
)
def test_streamed_equals_whole(secrets: list[str], text: str, cuts: list[int]) -> None:
    masker = StreamMasker(secrets)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out = "".join(masker.feed(piece) for piece in pieces) + masker.feed("", final=True)
    assert out == mask(text, secrets)


def test_a_secret_split_in_two_is_held_back_until_it_is_whole() -> None:
    masker = StreamMasker(["hunter2"])
    first = masker.feed("password: hun")
    assert "hun" not in first  # held back: it may start the secret
    second = masker.feed("ter2 ok")
    assert first + second + masker.feed("", final=True) == "password: ***** ok"


def test_without_secrets_nothing_is_held() -> None:
    assert StreamMasker([]).feed("abc") == "abc"
