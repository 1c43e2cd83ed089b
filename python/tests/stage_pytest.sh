#!/bin/sh
# Copies Debian's pytest (python3-pytest: pure Python) and what it imports
# into DEST, for a machine whose Python has no pytest and no package
# registry (the GPU hosts):
#   python/tests/stage_pytest.sh DEST
#   ... there: MEMCUDA_PYTEST_PATH=DEST python3 python/tests/ctest_runner.py gpu
# Checked with Python 3.11, 3.12 and 3.13 (pytest 7.2 prints deprecation
# warnings on the newer ones, nothing worse).
set -eu
dest=${1:?usage: stage_pytest.sh DEST}
src=/usr/lib/python3/dist-packages
mkdir -p "$dest"
for m in pytest _pytest pluggy iniconfig packaging attr attrs py py.py; do
  [ -e "$src/$m" ] || { echo "stage_pytest.sh: $src/$m missing (apt-get install python3-pytest)" >&2; exit 1; }
  cp -r "$src/$m" "$dest/"
done
echo "pytest staged in $dest"
