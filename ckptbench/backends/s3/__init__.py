"""S3 and S3-compatible object stores through boto3 (see :mod:`.backend`).

The package: ``options`` (S3Options, limits, target URLs), ``client`` (per-process session,
clients, counters), ``errors`` (one-line errors, retry accounting), ``writer`` (multipart
uploads), ``reader`` (ranged GETs), ``session`` (what the handles hold), and ``backend``,
which ties them to a target. Retries use botocore's ``standard`` mode; each retried
request is counted, by reason, in :meth:`S3Backend.stats` (and so in the records).
"""

from ckptbench.backends.s3.backend import S3Backend
from ckptbench.backends.s3.errors import public_endpoint
from ckptbench.backends.s3.options import S3Options, parse_target

__all__ = ["S3Backend", "S3Options", "parse_target", "public_endpoint"]
