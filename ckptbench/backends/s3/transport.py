"""The seam between the S3 backend and its data path: ``--s3-transport botocore`` (the
backend's own writer and reader, Python threads over botocore), ``crt`` (the AWS Common
Runtime's S3 client: native threads, no interpreter lock on the data path) or ``obstore``
(Rust ``object_store``). Only object data moves through a transport; the target's control
requests (marker, listing, manifest, deletes, aborting leftover uploads) stay on botocore,
so every transport shares one credential chain, one error vocabulary and one clean-up.

A transport is made lazily once per process (no connection crosses the runner's fork) and
kept in the process's client state.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlsplit

from ckptbench.backends.base import ReadHandle, WriteHandle
from ckptbench.errors import BackendError

if TYPE_CHECKING:
    from ckptbench.backends.s3.session import S3Session

MODULES = {"crt": ("ckptbench.backends.s3.crt", "awscrt"),
           "obstore": ("ckptbench.backends.s3.obstore_io", "obstore")}
# DCP's S3StorageWriter/Reader (s3torchconnector): the torch-dcp format's data path, not
# this backend's (whose own reads, the manifest's, stay on botocore); a run with another
# format is refused (S3Backend.check_run)
DCP_STORAGE = "s3torchconnector"
PACKAGES = {"crt": "awscrt", "obstore": "obstore", DCP_STORAGE: "s3torchconnector"}


class Transport(Protocol):
    """One process's data path to the target's bucket."""

    def open_write(self, key: str, size: int) -> WriteHandle: ...

    def open_read(self, key: str, plan: Sequence[tuple[int, int]] | None = None
                  ) -> ReadHandle: ...


@dataclass(frozen=True)
class Credentials:
    """Keys from boto3's standard chain, held in memory only (never recorded or printed)."""

    access_key: str
    secret_key: str
    token: str | None

    def __repr__(self) -> str:  # never a key in a traceback or a log line
        return "Credentials(<redacted>)"


def credentials(backend: S3Session) -> Credentials:
    """The current keys of boto3's standard chain (refreshed by boto3 where they expire)."""
    creds = backend.clients.session().get_credentials()
    if creds is None:
        raise BackendError(f"{backend.target}: no credentials found in boto3's standard chain; "
                           "allowed: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, roles")
    frozen = creds.get_frozen_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


@dataclass(frozen=True)
class Address:
    """Where a key's bytes live: scheme, host[:port], and the request path of a key."""

    scheme: str
    netloc: str
    bucket: str
    virtual_host: bool

    @classmethod
    def of(cls, backend: S3Session) -> Address:
        r = backend.clients.resolve()
        parts = urlsplit(r.endpoint)
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        virtual = r.addressing_style != "path"
        return cls(parts.scheme, f"{backend.bucket}.{netloc}" if virtual else netloc,
                   backend.bucket, virtual)

    def path(self, key: str) -> str:
        quoted = quote(key, safe="/~")
        return f"/{quoted}" if self.virtual_host else f"/{self.bucket}/{quoted}"


def transport_for(backend: S3Session) -> Transport:
    """This process's transport for `backend` (made on first use)."""
    name = backend.options.transport
    proc = backend.clients.proc()
    slot = f"transport:{name}"
    found: Transport | None = proc.clients.get(slot)
    if found is None:
        module = _module(name, backend.target)
        backend.clients.resolve()  # takes proc.lock itself: before, not under it
        with proc.lock:
            found = proc.clients.get(slot)
            if found is None:
                found = proc.clients[slot] = module.make(backend)
    return found


def _module(name: str, target: str) -> Any:
    module, package = MODULES[name]
    try:
        importlib.import_module(package)
    except ImportError:
        raise BackendError(f"{target}: --s3-transport {name} needs the {package} package; "
                           "allowed: pip install 'ckptbench[s3-transports]', or "
                           "--s3-transport botocore") from None
    return importlib.import_module(module)


def transfer_details(backend: S3Session) -> dict[str, Any]:
    """What the results record about the data path (and which retries it counts)."""
    name = backend.options.transport
    if name == "botocore":
        return {"transport": "botocore", "client": "botocore (classic; no CRT)",
                "retries_counted": True}
    out: dict[str, Any] = {"transport": name, "control": "botocore", "retries_counted": False}
    try:
        out["version"] = importlib.import_module(PACKAGES[name]).__version__
    except (ImportError, AttributeError):
        out["version"] = None
    return out
