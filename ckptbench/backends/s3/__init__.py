"""S3 and S3-compatible object stores through boto3 (see :mod:`.backend`)."""

from ckptbench.backends.s3.backend import S3Backend
from ckptbench.backends.s3.errors import public_endpoint
from ckptbench.backends.s3.options import S3Options, parse_target

__all__ = ["S3Backend", "S3Options", "parse_target", "public_endpoint"]
