"""The package's version, written once: pyproject.toml reads it for the wheel's metadata
(``[tool.setuptools.dynamic]``), and ``serverless_worker.__version__`` falls back to it
where the package runs without metadata (the Lambda layer copies the sources, not a
``.dist-info``). Bump it here for a release."""

VERSION = "0.1.0"
