"""Bearer keys: kept only as SHA-256 hashes, compared in constant time.

Every key is read through one function, ``cloud_api.settings.normalize_key`` (surrounding
whitespace is no part of a key): the environment's lists, the keys file, the demo key and
the bearer token of each request; a configured key that is not visible ASCII once
normalized is refused at start. So "is this an admin key" has one answer everywhere, and
``PRIVBERT_DEMO_KEY`` is refused at start when it is an admin key by any spelling.

Application keys may call ``/v1``; admin keys may call ``/admin`` and ``/v1``. A
record stores the caller's :func:`key_id` (a short hash), never the key. Routes take
the caller as an ``Annotated`` dependency::

    @router.post("/v1/records")
    def post_records(body: RecordsIn, caller: AppCaller): ...

The dependency also applies the per-key rate limit (429 with ``Retry-After``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from fastapi import Depends, Request

from cloud_api.errors import RateLimited, ServiceError
from cloud_api.settings import KeyList, Settings, check_key, normalize_key

Role = Literal["app", "admin"]
_COMMENT = re.compile(r"(?:^|\s)#")


class Unauthorized(ServiceError):
    status, kind, title = 401, "unauthorized", "Missing or unknown API key"


class Forbidden(ServiceError):
    status, kind, title = 403, "forbidden", "This key may not use this endpoint"


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def key_id(key: str) -> str:
    """A short public id of a key (12 hex digits of a separate hash): stored with records,
    shown in logs, accepted by erasure; the key cannot be recovered from it."""
    return hashlib.sha256(b"privbert-key-id\0" + key.encode("utf-8")).hexdigest()[:12]


@dataclass(frozen=True)
class Caller:
    role: Role
    key_id: str


class KeyRing:
    """Hashes of the configured keys with their role and id."""

    def __init__(self, entries: list[tuple[bytes, Role, str]], disabled: bool = False):
        self._entries = entries
        self.disabled = disabled

    @classmethod
    def from_settings(cls, s: Settings) -> KeyRing:
        entries: list[tuple[bytes, Role, str]] = []
        by_role: dict[Role, KeyList] = {"app": s.api_keys, "admin": s.admin_keys}
        for role, keys in by_role.items():
            for k in keys:
                raw = check_key(k.get_secret_value(), f"PRIVBERT_{role.upper()}_KEYS")
                entries.append((key_hash(raw), role, key_id(raw)))
        if s.keys_file is not None:
            entries += _read_keys_file(s.keys_file)
        if s.demo and s.demo_key is not None:  # the /demo page's key (cloud_api/routes/web.py)
            raw = check_key(s.demo_key.get_secret_value(), "PRIVBERT_DEMO_KEY")
            if any(role == "admin" and hmac.compare_digest(d, key_hash(raw))
                   for d, role, _ in entries):
                raise ValueError("PRIVBERT_DEMO_KEY is an admin key: the demo page hands its "
                                 "key to anyone who opens it; use a throwaway application key")
            entries.append((key_hash(raw), "app", key_id(raw)))
        if not entries and not s.auth_disabled:
            raise ValueError("no API keys configured: set PRIVBERT_API_KEYS and "
                             "PRIVBERT_ADMIN_KEYS (comma-separated) or PRIVBERT_KEYS_FILE "
                             "(or PRIVBERT_AUTH_DISABLED=1 for local development)")
        return cls(entries, disabled=s.auth_disabled and not entries)

    def key_ids(self) -> set[str]:
        """The ids of the configured keys ("anonymous" when auth is disabled)."""
        return {kid for _, _, kid in self._entries} | ({"anonymous"} if self.disabled else set())

    def verify(self, token: str) -> Caller | None:
        """The caller of ``token``; every entry is compared so the time does not depend
        on which key (if any) matches."""
        h = key_hash(token)
        found: Caller | None = None
        for digest, role, kid in self._entries:
            if hmac.compare_digest(digest, h) and found is None:
                found = Caller(role, kid)
        return found


def _read_keys_file(path: Path) -> list[tuple[bytes, Role, str]]:
    """Lines ``app KEY`` / ``admin KEY`` / ``app sha256:HEX [id]`` (HEX: the SHA-256 of the
    key as :func:`normalize_key` reads it); ``#`` at the start of a line or after a space
    starts a comment (inside a key it is part of the key, as in the environment)."""
    out: list[tuple[bytes, Role, str]] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:  # e.g. saved as UTF-16 by an editor
        raise ValueError(f"PRIVBERT_KEYS_FILE {path}: not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start}); save it as UTF-8 (one 'app|admin KEY' per line)"
                         ) from None
    for n, line in enumerate(text.splitlines(), 1):
        line = _COMMENT.split(line, maxsplit=1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) not in (2, 3) or parts[0] not in ("app", "admin"):
            raise ValueError(f"{path}:{n}: expected 'app|admin KEY' or 'app|admin sha256:HEX'")
        role: Role = parts[0]  # type: ignore[assignment]
        if parts[1].startswith("sha256:"):
            hexd = parts[1][7:]
            if len(hexd) != 64:
                raise ValueError(f"{path}:{n}: sha256: needs 64 hex digits")
            kid = parts[2] if len(parts) == 3 else hexd[:12]
            out.append((bytes.fromhex(hexd), role, kid))
        else:
            key = check_key(parts[1], f"{path}:{n}")
            out.append((key_hash(key), role, key_id(key)))
    return out


def _bearer(header: str) -> str | None:
    """The token of ``Bearer TOKEN``, normalized as every configured key is."""
    scheme, _, token = header.partition(" ")
    token = normalize_key(token)
    if scheme.lower() != "bearer" or not token:
        return None
    return token


async def authenticate(app_state, authorization: str | None, need: Role, state: dict
                       ) -> Caller:
    """The caller of an ``Authorization`` header value for a route that needs ``need``,
    after the per-key rate limit; ``state`` (the request's scope state) learns its key id.
    Unauthorized, Forbidden or RateLimited otherwise. The one check of every route: the
    FastAPI dependencies below and the predict route call it."""
    ring: KeyRing = app_state.keys
    caller: Caller | None
    if ring.disabled:
        caller = Caller("admin", "anonymous")
    else:
        token = _bearer(authorization or "")
        caller = ring.verify(token) if token else None
        if caller is None:
            raise Unauthorized("send 'Authorization: Bearer <key>' with a valid key")
        if need == "admin" and caller.role != "admin":
            raise Forbidden("an application key may not call /admin")
    state["key_id"] = caller.key_id
    # in memory, or (PRIVBERT_RATE_LIMIT_STORE=database) one bucket for every replica
    wait = await app_state.rate_limiter.acquire_async(caller.key_id)
    if wait > 0:
        raise RateLimited(f"key {caller.key_id} is over its rate limit", retry_after=wait)
    return caller


async def _caller(request: Request, need: Role) -> Caller:
    return await authenticate(request.app.state, request.headers.get("authorization"), need,
                        request.scope.setdefault("state", {}))


# async: no I/O here, and a plain def would cost a thread-pool round trip per request
async def require_app(request: Request) -> Caller:
    return await _caller(request, "app")


async def require_admin(request: Request) -> Caller:
    return await _caller(request, "admin")


AppCaller = Annotated[Caller, Depends(require_app)]
AdminCaller = Annotated[Caller, Depends(require_admin)]
