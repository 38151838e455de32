#!/usr/bin/env bash
# Installs the rffm package from the checkout that holds this file into the new conda env.
set -euo pipefail
python -m pip install --no-deps "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
