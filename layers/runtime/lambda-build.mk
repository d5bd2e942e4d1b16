# What the layer's and the functions' makefile builds share: the interpreter and platform
# of the Lambda runtime, the wheel install and the bytecode compile. functions/lambda-build.mk
# is a symlink to this file (SAM copies each code root on its own, following symlinks).

# Lambda runs python3.13, so the bytecode must come from a 3.13 interpreter.
LAMBDA_PYTHON_VERSION := 3.13
PYTHON ?= python$(LAMBDA_PYTHON_VERSION)
ARCHITECTURE ?= x86_64
# manylinux2014 (glibc 2.17) and manylinux_2_28 wheels run on Amazon Linux 2023
# (glibc 2.34) on either CPU.
WHEEL_PLATFORM_x86_64 := manylinux2014_x86_64 manylinux_2_28_x86_64
WHEEL_PLATFORM_arm64 := manylinux2014_aarch64 manylinux_2_28_aarch64
WHEEL_PLATFORM := $(WHEEL_PLATFORM_$(ARCHITECTURE))
PY_TAG := $(subst .,,$(LAMBDA_PYTHON_VERSION))

# One line and exit 2 for each way the build cannot produce what Lambda runs.
define check_build_python
	@test -n "$(ARTIFACTS_DIR)" || { echo "ARTIFACTS_DIR is not set (sam build sets it)" >&2; exit 2; }
	@test -n "$(WHEEL_PLATFORM)" || { echo "ARCHITECTURE must be x86_64 or arm64, not '$(ARCHITECTURE)'" >&2; exit 2; }
	@"$(PYTHON)" -c 'import sys; sys.exit(sys.version_info[:2] != ($(subst .,$(comma),$(LAMBDA_PYTHON_VERSION))))' \
		2>/dev/null || { echo "the build needs Python $(LAMBDA_PYTHON_VERSION), the Lambda runtime's version, as \
	PYTHON, and '$(PYTHON)' is $$("$(PYTHON)" -V 2>&1 | sed -n 1p): make sam-build finds one, \
	or set PYTHON=/path/to/python$(LAMBDA_PYTHON_VERSION)" >&2; exit 2; }
endef
comma := ,

# $(call pip_install_wheels,TARGET_DIR,REQUIREMENTS): the pinned wheels for Lambda's platform.
define pip_install_wheels
	"$(PYTHON)" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
		--no-warn-conflicts --no-compile --upgrade --target "$(1)" --only-binary=:all: \
		--implementation cp --python-version $(LAMBDA_PYTHON_VERSION) --abi cp$(PY_TAG) \
		$(addprefix --platform ,$(WHEEL_PLATFORM)) -r "$(2)"
endef

# $(call compile_bytecode,DIR,PREFIX): unchecked-hash .pyc for every module, paths as Lambda sees them.
define compile_bytecode
	"$(PYTHON)" -m compileall -q -j 0 -f --invalidation-mode unchecked-hash -s "$(1)" -p $(2) "$(1)"
endef
