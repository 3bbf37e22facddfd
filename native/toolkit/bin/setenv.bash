# CANN's per-package environment script (samples' run.sh source it): the same as ../set_env.sh.
# shellcheck source=../set_env.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/set_env.sh"
