"""An embedded AWS for ``serverless-worker invoke``: moto's server on loopback holding what a
local run of template.yaml expects, under the names it gives them (``StateTable``, the
table built from the template's own definition, and ``ExecutorFunction``, an inert
function that accepts the scheduler's asynchronous invokes so you can run the executor
yourself with the ledger key).

Prints the environment to use, then serves until Ctrl-C::

    .venv/bin/python scripts/local_aws.py --port 5000
"""

from __future__ import annotations

import argparse
import io
import logging
import signal
import sys
import zipfile
from pathlib import Path

import boto3
import requests
from moto.server import ThreadedMotoServer

from serverless_worker.local.table import create_state_table

ROOT = Path(__file__).resolve().parents[1]
REGION = "us-east-1"


def _inert_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "def lambda_handler(event, context):\n    return event\n")
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=5000,
                        help="port on 127.0.0.1 (default 5000; 0 picks one)")
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=args.port, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # With use_docker off, an asynchronous Invoke of the executor is accepted and runs nothing.
    requests.post(f"{url}/moto-api/config", json={"lambda": {"use_docker": False}}, timeout=10)
    session = boto3.session.Session(aws_access_key_id="local", aws_secret_access_key="local",
                                    region_name=REGION)
    dynamodb = session.client("dynamodb", endpoint_url=url)
    create_state_table(dynamodb, "StateTable", template=ROOT / "template.yaml")
    role = session.client("iam", endpoint_url=url).create_role(
        RoleName="serverless-worker-local", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    session.client("lambda", endpoint_url=url).create_function(
        FunctionName="ExecutorFunction", Runtime="python3.13", Role=role, Handler="app.lambda_handler",
        Code={"ZipFile": _inert_zip()}, Timeout=900)
    print(f"export AWS_ENDPOINT_URL={url} AWS_DEFAULT_REGION={REGION} "
          "AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local", flush=True)
    print("# StateTable and ExecutorFunction are ready; Ctrl-C stops", file=sys.stderr, flush=True)
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    while not stop:
        signal.pause()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
