# npusim's CANN-shaped toolkit: what CANN's set_env.sh exports, for this install.
# Source it (bash or zsh): `source .../toolkit/set_env.sh`. Safe under `set -euo pipefail`.
_npusim_toolkit="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
export ASCEND_TOOLKIT_HOME="${_npusim_toolkit}"
export ASCEND_HOME_PATH="${_npusim_toolkit}"
export ASCEND_INSTALL_PATH="${_npusim_toolkit}"
case ":${LD_LIBRARY_PATH:-}:" in
  *":${_npusim_toolkit}/lib64:"*) ;;
  *) export LD_LIBRARY_PATH="${_npusim_toolkit}/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;;
esac
unset _npusim_toolkit
