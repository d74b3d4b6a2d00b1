"""Bearer-token access control for the server stub.

Two ways to configure it (exactly one, unless anonymous access is asked for explicitly):

* ``--token T``: one token with access to every slice.
* ``--tokens-file F``: a JSON file scoping each token to slice-ID patterns
  (:func:`fnmatch.fnmatchcase` syntax)::

      {"tokens": [
          {"name": "alice", "token": "3f9c...", "slices": ["slc_7c1e*"], "write": ["*"]},
          {"name": "ci", "token": "a71b...", "slices": ["*"]}
      ]}

Every token reads; a token writes (labels, new slices) only with a ``write`` list, and only
where its read scope reaches too: a slice must match a ``slices`` pattern *and* a ``write``
pattern. ``--write-token T`` adds one token that reads and writes every slice (beside
``--token``); a token without ``write`` (every token of an older tokens file) is read-only.

Tokens are compared in constant time (:func:`hmac.compare_digest`) against every configured
token, and never appear in ``repr``, logs or error messages; grants are known by ``name``.
"""

from __future__ import annotations

import hmac
import json
import os
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from rayform.errors import InvalidArgumentError

__all__ = ["ANONYMOUS", "Auth", "Grant", "load_tokens_file"]

_MIN_TOKEN_LEN = 8
_TOKEN_RE = re.compile(r"[\x21-\x7e]+")  # visible ASCII, no spaces
_PATTERN_RE = re.compile(r"[a-z0-9_*?\[\]!-]+")
_NAME_RE = re.compile(r"[A-Za-z0-9_.@-]{1,64}")


@dataclass(frozen=True)
class Grant:
    """An authenticated caller: a name, the slice-ID patterns it may read and those it may
    write (labels, new slices; none for a read-only token)."""

    name: str
    patterns: tuple[str, ...]
    token: bytes = field(repr=False, compare=False, default=b"")
    write: tuple[str, ...] = ()

    def allows(self, slice_id: str) -> bool:
        """Whether this grant may read slice ``slice_id``."""
        return any(fnmatchcase(slice_id, p) for p in self.patterns)

    def may_write(self, slice_id: str) -> bool:
        """Whether this grant may write slice ``slice_id``: within its read scope *and* its
        write scope (a write token never writes where it cannot read)."""
        return self.allows(slice_id) and any(fnmatchcase(slice_id, p) for p in self.write)


#: The grant given to requests without a token when anonymous access is enabled.
ANONYMOUS = Grant(name="anonymous", patterns=("*",))


def _check_token(token: object, where: str) -> bytes:
    if not isinstance(token, str) or len(token) < _MIN_TOKEN_LEN or not _TOKEN_RE.fullmatch(token):
        raise InvalidArgumentError(
            f"{where}: a token must be a string of at least {_MIN_TOKEN_LEN} visible ASCII "
            "characters without spaces; generate one with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(24))'`."
        )
    return token.encode("ascii")


def load_tokens_file(path: str | os.PathLike[str]) -> list[Grant]:
    """Read and validate a tokens file.

    Raises:
        InvalidArgumentError: the file is missing, not JSON, or breaks the format (the
            message names the entry and what to fix; it never contains a token).
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_bytes())
    except FileNotFoundError as exc:
        raise InvalidArgumentError(
            f"tokens file {p} does not exist: check the --tokens-file path"
        ) from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(f"tokens file {p} is not readable JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), list) or not doc["tokens"]:
        raise InvalidArgumentError(
            f'tokens file {p}: expected {{"tokens": [{{"name": ..., "token": ..., "slices": [...]}}]}} '
            "with at least one entry"
        )
    grants: list[Grant] = []
    names: set[str] = set()
    for i, entry in enumerate(doc["tokens"]):
        where = f"tokens file {p}, entry {i}"
        if not isinstance(entry, dict):
            raise InvalidArgumentError(
                f"{where}: each entry must be an object with name, token, slices"
            )
        unknown = set(entry) - {"name", "token", "slices", "write"}
        if unknown:
            raise InvalidArgumentError(
                f"{where}: unknown keys {sorted(unknown)} (allowed: name, token, slices, write)"
            )
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise InvalidArgumentError(
                f"{where}: 'name' must be 1-64 characters of letters, digits, _ . @ -"
            )
        where = f"tokens file {p}, entry {i} ({name})"
        if name in names:
            raise InvalidArgumentError(
                f"{where}: the name {name!r} is used twice; names must be unique"
            )
        names.add(name)
        token = _check_token(entry.get("token"), where)
        if any(hmac.compare_digest(token, g.token) for g in grants):
            raise InvalidArgumentError(
                f"{where}: the same token is given twice; every token must be unique"
            )
        slices = entry.get("slices")
        if (
            not isinstance(slices, list)
            or not slices
            or not all(isinstance(s, str) and _PATTERN_RE.fullmatch(s) for s in slices)
        ):
            raise InvalidArgumentError(
                f"{where}: 'slices' must be a non-empty list of slice-ID patterns such as "
                "'slc_7c1e04aa', 'slc_7c1e*' or '*'"
            )
        write = entry.get("write", [])
        if not isinstance(write, list) or not all(
            isinstance(s, str) and _PATTERN_RE.fullmatch(s) for s in write
        ):
            raise InvalidArgumentError(
                f"{where}: 'write' must be a list of slice-ID patterns such as 'slc_7c1e*' or "
                "'*' (the slices this token may label and publish into; leave it out for a "
                "read-only token)"
            )
        grants.append(Grant(name=name, patterns=tuple(slices), token=token, write=tuple(write)))
    return grants


class Auth:
    """Decides who a request is from.

    Args:
        grants: the configured tokens.
        allow_anonymous: requests without a token get full access (only without grants).

    Raises:
        InvalidArgumentError: no grants and anonymous access not enabled, or both.
    """

    def __init__(self, grants: list[Grant], *, allow_anonymous: bool = False) -> None:
        if not grants and not allow_anonymous:
            raise InvalidArgumentError(
                "no access control configured: pass --token T or --tokens-file F, or "
                "--allow-anonymous to serve every slice to anyone who can reach the port"
            )
        if grants and allow_anonymous:
            raise InvalidArgumentError(
                "--allow-anonymous cannot be combined with --token/--tokens-file: drop one of them"
            )
        self.grants = list(grants)
        self.allow_anonymous = allow_anonymous

    @classmethod
    def from_options(
        cls,
        token: str | None = None,
        tokens_file: str | os.PathLike[str] | None = None,
        allow_anonymous: bool = False,
        write_token: str | None = None,
    ) -> Auth:
        """Build from the ``serve`` options (``--token``, ``--tokens-file``,
        ``--allow-anonymous``, ``--write-token``)."""
        if token is not None and tokens_file is not None:
            raise InvalidArgumentError("--token and --tokens-file are exclusive: use one of them")
        grants: list[Grant] = []
        if token is not None:
            grants = [Grant(name="token", patterns=("*",), token=_check_token(token, "--token"))]
        elif tokens_file is not None:
            grants = load_tokens_file(tokens_file)
        if write_token is not None:
            if tokens_file is not None:
                raise InvalidArgumentError(
                    "--write-token cannot be combined with --tokens-file: give the writing "
                    'token a "write" list in the tokens file instead'
                )
            secret = _check_token(write_token, "--write-token")
            if any(hmac.compare_digest(secret, g.token) for g in grants):
                raise InvalidArgumentError(
                    "--write-token is the same as --token: use two different tokens"
                )
            grants.append(Grant(name="writer", patterns=("*",), token=secret, write=("*",)))
        return cls(grants, allow_anonymous=allow_anonymous)

    def authenticate(self, authorization: str | None) -> Grant | None:
        """The grant for an ``Authorization`` header value, or ``None`` (answer 401).

        Every configured token is compared, in constant time, whatever matches first.
        """
        if self.allow_anonymous:
            return ANONYMOUS  # any header or none: the operator opened the server to all
        if authorization is None:
            return None
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        try:
            presented = value.strip().encode("ascii")
        except UnicodeEncodeError:
            return None
        found: Grant | None = None
        for grant in self.grants:
            if hmac.compare_digest(presented, grant.token) and found is None:
                found = grant
        return found
