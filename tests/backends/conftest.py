"""Fixtures shared by the backend tests: ``s3env`` (boto3's chain reaching the session's
MinIO), defined with the S3 backend's tests and used by the transport tests too."""

from .test_s3 import s3env  # noqa: F401
