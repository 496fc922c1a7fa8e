"""Secrets at rest and in output: encryption with key rotation, and masking.

Values that must stay secret (``DBT_ENV_SECRET_*`` variables, connection passwords and keyfiles,
git credentials) are stored as Fernet tokens (AES-128-CBC + HMAC-SHA256, from ``cryptography``).
A :class:`SecretBox` holds several keys, newest first: the newest encrypts, every key still
decrypts, so a key is rotated by putting a new one in front and re-encrypting at leisure
(:meth:`SecretBox.rotate`) before the old one is dropped.

Keys come from the ``RUNPLANE_SECRET_KEYS`` setting (comma-separated, newest first). In production
that variable is filled from a Kubernetes Secret; on one machine ``runplane up`` and the demo read
it from a local key file made on first use (:func:`load_or_create_key_file`).

:func:`mask` replaces every secret value in a text with ``*****``; run logs and uploaded artifacts
pass through it before they are stored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from runplane.basics.errors import RunplaneError

if TYPE_CHECKING:
    from runplane.basics.settings import Settings

MASK = "*****"
SECRET_ENV_PREFIX = "DBT_ENV_SECRET_"


class SecretKeyError(RunplaneError):
    """No usable key, or a token that none of the keys opens (tampered, or its key was dropped)."""


def generate_key() -> str:
    """A new random Fernet key (32 bytes, url-safe base64)."""
    return Fernet.generate_key().decode("ascii")


def parse_keys(value: str) -> list[str]:
    """The keys of a ``RUNPLANE_SECRET_KEYS`` value: comma-separated, newest first, blanks ignored."""
    return [key.strip() for key in value.split(",") if key.strip()]


class SecretBox:
    """Encrypts with the newest key and decrypts with any of them.

    Raises :class:`SecretKeyError` when given no key or a malformed one, so a wrong setting fails
    at start-up rather than at the first secret.
    """

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise SecretKeyError("no secret key: set RUNPLANE_SECRET_KEYS (comma-separated Fernet keys, newest first)")
        fernets = []
        for position, key in enumerate(keys):
            try:
                fernets.append(Fernet(key.encode("ascii")))
            except (ValueError, UnicodeEncodeError) as exc:
                # The key itself is never echoed: only its position in the list.
                raise SecretKeyError(f"RUNPLANE_SECRET_KEYS: key {position + 1} is not a Fernet key") from exc
        self._fernet = MultiFernet(fernets)

    @classmethod
    def from_keys(cls, value: str) -> SecretBox:
        """From a ``RUNPLANE_SECRET_KEYS`` value."""
        return cls(parse_keys(value))

    def encrypt(self, plaintext: str) -> str:
        """The ciphertext of ``plaintext`` under the newest key (a different token every call)."""
        return self._fernet.encrypt(plaintext.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str) -> str:
        """The plaintext of a token made by any of the keys."""
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError) as exc:
            raise SecretKeyError("a stored secret cannot be decrypted with the configured keys") from exc

    def rotate(self, token: str) -> str:
        """The same secret re-encrypted under the newest key (for re-encrypting after a rotation)."""
        try:
            return self._fernet.rotate(token.encode("ascii")).decode("ascii")
        except (InvalidToken, UnicodeError) as exc:
            raise SecretKeyError("a stored secret cannot be decrypted with the configured keys") from exc


def is_secret_name(name: str) -> bool:
    """Whether an environment variable holds a secret by dbt Cloud's naming convention."""
    return name.startswith(SECRET_ENV_PREFIX)


def mask(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of every non-empty secret replaced by ``*****``.

    Longer secrets are matched first, so a secret that contains another is masked whole.
    """
    values = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not values:
        return text
    pattern = re.compile("|".join(re.escape(v) for v in values))
    return pattern.sub(MASK, text)


def load_or_create_key_file(path: Path) -> str:
    """The key kept in ``path``; made (mode 0600, directory 0700) when the file does not exist.

    For one machine (``runplane up``, the demo): the key survives restarts, so secrets stored by an
    earlier start can still be read.
    """
    path = path.expanduser()
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = generate_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return path.read_text(encoding="ascii").strip()
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(key + "\n")
    return key


def box_from_settings(settings: Settings) -> SecretBox:
    """The box of ``settings.secret_keys``; :class:`SecretKeyError` when it is empty or malformed."""
    return SecretBox.from_keys(settings.secret_keys.get_secret_value())


def ensure_local_keys(settings: Settings) -> str:
    """``RUNPLANE_SECRET_KEYS`` for one machine: the setting when given, else the local key file's key."""
    configured = settings.secret_keys.get_secret_value()
    if parse_keys(configured):
        return configured
    return load_or_create_key_file(Path(settings.secret_key_file))
