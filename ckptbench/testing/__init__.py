"""What ships for testing a backend: the conformance suite every backend passes
(``conformance``, needs pytest) and wrapper backends that break one thing on purpose
(``faults``), so that a backend written outside ckptbench is tested the way the built-in
ones are (docs/backends.md).

The services the repository's own tests and benchmarks start (MinIO, GlusterFS, warp,
fio, a fault-injecting HTTP proxy) are not part of the package: they live in the
repository's top-level ``harness`` package.
"""
