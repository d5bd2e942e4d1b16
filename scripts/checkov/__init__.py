"""Custom checkov checks for `make iam-scan` (loaded with --external-checks-dir)."""
