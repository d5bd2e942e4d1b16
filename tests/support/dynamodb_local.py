"""Run AWS's DynamoDB Local (``DynamoDBLocal.jar``, the real engine) on a loopback port.

``scripts/install-dynamodb-local.sh`` puts the jar in ``.cache/dynamodb-local`` (or in
``$DYNAMODB_LOCAL_DIR``); Java 17+ must be on PATH (or under ``$JAVA_HOME``). The server
runs in memory with dummy credentials and is stopped by the context manager.

    with DynamoDBLocal().start() as local:
        client = local.client()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

__all__ = ["DEFAULT_DIR", "DynamoDBLocal", "find_java", "install_dir", "unavailable_reason"]

DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".cache" / "dynamodb-local"
REGION = "us-east-1"
_DUMMY = {"aws_access_key_id": "dummy", "aws_secret_access_key": "dummy", "region_name": REGION}


def install_dir() -> Path:
    return Path(os.environ.get("DYNAMODB_LOCAL_DIR") or DEFAULT_DIR)


def find_java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def unavailable_reason(directory: Path | None = None) -> str | None:
    """Why DynamoDB Local cannot run here, or ``None`` when it can."""
    if find_java() is None:
        return "java is not on PATH (DynamoDB Local needs Java 17+)"
    jar = (directory or install_dir()) / "DynamoDBLocal.jar"
    if not jar.is_file():
        return f"{jar} is missing (run scripts/install-dynamodb-local.sh)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DynamoDBLocal:
    """One in-memory DynamoDB Local process."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or install_dir()
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log = Path(tempfile.mkstemp(prefix="dynamodb-local-", suffix=".log")[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **config: Any) -> Any:
        """A low-level DynamoDB client for this server (dummy credentials, short timeouts)."""
        settings: dict[str, Any] = {"connect_timeout": 2, "read_timeout": 10,
                                    "retries": {"mode": "standard", "max_attempts": 3}}
        settings.update(config)
        return boto3.client("dynamodb", endpoint_url=self.endpoint, config=Config(**settings), **_DUMMY)

    def start(self, timeout: float = 60.0) -> DynamoDBLocal:
        reason = unavailable_reason(self.directory)
        if reason:
            raise RuntimeError(f"DynamoDB Local cannot start: {reason}")
        for _ in range(3):  # another process may grab the free port before java binds it
            self.port = _free_port()
            if self._launch(timeout):
                return self
        raise RuntimeError(f"DynamoDB Local did not start; its log:\n{self._log_tail()}")

    def _launch(self, timeout: float) -> bool:
        java = find_java()
        assert java is not None
        command = [java, f"-Djava.library.path={self.directory / 'DynamoDBLocal_lib'}", "-jar",
                   str(self.directory / "DynamoDBLocal.jar"), "-inMemory", "-port", str(self.port)]
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(command, cwd=self.directory, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT)
        probe = self.client(connect_timeout=0.5, read_timeout=2, retries={"max_attempts": 1})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                probe.list_tables(Limit=1)
                return True
            except (BotoCoreError, ClientError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"DynamoDB Local did not answer within {timeout:.0f}s; "
                           f"its log:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def __enter__(self) -> DynamoDBLocal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.unlink(missing_ok=True)
