"""``python -m megamoe.compat install-deep-ep | uninstall-deep-ep | status``."""

import sys

from .deep_ep_switch import main

sys.exit(main(sys.argv[1:]))
