"""``python -m modelforge run|test|up|down``: what ``make run`` starts (``modelforge.devstack``).

This module is compiled each time it is started (``-m`` never reads a cached main module), so it stays
small: Ctrl-C is taken over first, then the stack's module is imported from its cached bytecode. Ctrl-C
in those first moments stops with the same words as later, not a traceback from inside an import.
"""

import signal
import sys


def _interrupted_while_importing(signum: int, frame: object) -> None:
    sys.stdout.write("modelforge: interrupted\nmodelforge: stopped\n")
    sys.stdout.flush()
    raise SystemExit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _interrupted_while_importing)
    from modelforge import devstack

    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sys.exit(devstack.main(sys.argv[1:]))
    except KeyboardInterrupt:
        # Ctrl-C before run() took the signal over: nothing was started.
        devstack.say("interrupted")
        devstack.say("stopped")
        sys.exit(0)
