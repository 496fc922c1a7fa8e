"""The secret box: rotation, tampering, bad keys, and masking."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from runplane.basics.secrets import (
    MASK,
    SecretBox,
    SecretKeyError,
    box_from_settings,
    ensure_local_keys,
    generate_key,
    is_secret_name,
    load_or_create_key_file,
    mask,
)
from runplane.basics.settings import Settings


def test_round_trip_and_ciphertext_hides_the_value() -> None:
    box = SecretBox([generate_key()])
    token = box.encrypt("hunter2-password")
    assert "hunter2" not in token
    assert box.decrypt(token) == "hunter2-password"
    assert box.encrypt("hunter2-password") != token  # random IV: equal secrets are not linkable


def test_rotation_newest_encrypts_older_still_decrypt() -> None:
    old, new = generate_key(), generate_key()
    old_box = SecretBox([old])
    stored = old_box.encrypt("s3cret")
    rotated_box = SecretBox([new, old])
    assert rotated_box.decrypt(stored) == "s3cret"
    fresh = rotated_box.encrypt("s3cret")
    with pytest.raises(SecretKeyError):
        old_box.decrypt(fresh)  # made with the new key
    re_encrypted = rotated_box.rotate(stored)
    assert SecretBox([new]).decrypt(re_encrypted) == "s3cret"  # the old key can now be dropped


def test_dropped_key_and_tampered_token_fail_clearly() -> None:
    stored = SecretBox([generate_key()]).encrypt("x")
    with pytest.raises(SecretKeyError, match="cannot be decrypted"):
        SecretBox([generate_key()]).decrypt(stored)
    box = SecretBox([generate_key()])
    token = box.encrypt("x")
    tampered = token[:-5] + ("A" if token[-5] != "A" else "B") + token[-4:]
    with pytest.raises(SecretKeyError):
        box.decrypt(tampered)
    with pytest.raises(SecretKeyError):
        box.decrypt("not a token at all ü")


def test_bad_keys_fail_without_echoing_the_key() -> None:
    with pytest.raises(SecretKeyError, match="no secret key"):
        SecretBox.from_keys(" , ")
    with pytest.raises(SecretKeyError, match="key 2 is not a Fernet key") as info:
        SecretBox.from_keys(f"{generate_key()},definitely-not-a-key")
    assert "definitely-not-a-key" not in str(info.value)


def test_keys_from_settings_newest_first() -> None:
    old, new = generate_key(), generate_key()
    stored = SecretBox([old]).encrypt("v")
    box = box_from_settings(Settings(secret_keys=SecretStr(f" {new} , {old} ")))
    assert box.decrypt(stored) == "v"
    assert SecretBox([new]).decrypt(box.encrypt("w")) == "w"
    assert new not in repr(Settings(secret_keys=SecretStr(new)))  # settings never print the keys


def test_local_key_file_is_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "state" / "secret.key"
    key = load_or_create_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_or_create_key_file(path) == key
    SecretBox([key])  # a valid key
    assert ensure_local_keys(Settings(secret_key_file=str(path))) == key
    assert ensure_local_keys(Settings(secret_keys=SecretStr("given"), secret_key_file=str(path))) == "given"


def test_secret_names_follow_dbt_cloud() -> None:
    assert is_secret_name("DBT_ENV_SECRET_PASSWORD")
    assert not is_secret_name("DBT_ENV_PASSWORD")
    assert not is_secret_name("dbt_env_secret_x")


def test_mask_replaces_every_occurrence_longest_first() -> None:
    text = "user=alice pass=abc123 again abc123 and abc"
    assert mask(text, ["abc123", "", "abc"]) == f"user=alice pass={MASK} again {MASK} and {MASK}"
    assert mask("a.b a+b", ["a.b"]) == f"{MASK} a+b"  # regex characters are literal
    assert mask("nothing here", []) == "nothing here"


_NO_STAR = st.text(alphabet=st.characters(blacklist_characters="*"), max_size=30)


@given(
    secrets=st.lists(st.text(alphabet=st.characters(blacklist_characters="*"), min_size=1, max_size=12), min_size=1),
    before=_NO_STAR,
    after=_NO_STAR,
)
def test_mask_leaves_no_secret_behind(secrets: list[str], before: str, after: str) -> None:
    # Overlapping and nested secrets included: nothing of any secret survives outside a mask.
    masked = mask(before + "".join(secrets) + after + secrets[0], secrets)
    for secret in secrets:
        assert secret not in masked
