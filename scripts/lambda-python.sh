#!/bin/sh
# Prints the path of a Python interpreter of the Lambda runtime's version (3.13), or one
# line saying there is none and exits 2. Bytecode shipped to Lambda must come from the same
# minor version Lambda runs, and the project's venvs use it too.
#
# Looks, in order, at: $LAMBDA_PYTHON, python3.13 on the PATH, pyenv's newest 3.13, and
# /usr/bin/python3.13 / /usr/local/bin/python3.13. A pyenv shim that answers "command not
# found" (3.13 installed but not selected) does not count: each candidate must run.
want=${LAMBDA_PYTHON_VERSION:-3.13}
works() { [ -n "$1" ] && "$1" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$want'.split('.'))))" 2>/dev/null; }
for candidate in "${LAMBDA_PYTHON:-}" "$(command -v "python$want" 2>/dev/null)" \
    "$(pyenv prefix "$want" 2>/dev/null | tail -n 1)/bin/python$want" \
    "/usr/bin/python$want" "/usr/local/bin/python$want"; do
    if works "$candidate"; then
        echo "$candidate"
        exit 0
    fi
done
echo "no Python $want interpreter found (the Lambda runtime is python$want): install one (pyenv install $want, or your OS's python$want package) or set LAMBDA_PYTHON=/path/to/python$want" >&2
exit 2
