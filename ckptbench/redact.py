"""Keeping credentials out of results files and printed descriptions: one rule, used by the
backends (``Backend.describe``) and by ``records`` (every record written).

A value is replaced by ``<redacted>`` when its key names a credential: a word ``secret``,
``password``, ``passwd``, ``token``, ``credential(s)``, ``session``, ``signature`` or ``sas``
anywhere in the name (``aws_secret_access_key``, ``sas_token``, ``clientSecret``), or ``key``
alone or after ``access``/``secret``/``account``/``api``/``private``/``client``/``master``
(s3fs spells the access key id ``key=``; ``chunk_key`` and ``state_keys`` are not secrets).
A URL that carries ``user:password@`` or a query string (a pre-signed or SAS URL) keeps only
its scheme, host, port and path. Where credentials came from (``auth: "env"``) is kept.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = "<redacted>"
_SECRET_WORDS = frozenset({"secret", "password", "passwd", "token", "credential", "credentials",
                           "session", "signature", "sas"})
_KEY_OWNERS = frozenset({"access", "secret", "account", "api", "private", "client", "master"})
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def is_secret_name(name: str) -> bool:
    """Whether a key (an option, a field) names a credential."""
    words = [w.lower() for w in _WORD.findall(str(name))]
    if _SECRET_WORDS.intersection(words):
        return True
    return any(w == "key" and ((i == 0 and len(words) == 1)
                               or (i > 0 and words[i - 1] in _KEY_OWNERS))
               for i, w in enumerate(words))


def public_url(url: str) -> str:
    """The URL without user:password@, query and fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:  # not a port number: keep what was there, minus the user part
        port = None
    netloc = (host + (f":{port}" if port else "")) if parts.username or parts.password \
        else parts.netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _redact_text(text: str) -> str:
    if "://" not in text or any(c.isspace() for c in text):  # one URL, not a sentence
        return text
    parts = urlsplit(text)
    if parts.username or parts.password or parts.query:
        return public_url(text)
    return text


def redact(value: Any) -> Any:
    """`value` with every credential replaced (dicts and lists recursively, URLs cleaned);
    named tuples are treated as the records they are (their field names are checked)."""
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_name(k) else redact(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return redact(value._asdict())
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _redact_text(value)
    return value
