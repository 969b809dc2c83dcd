"""swabench: which way of running sliding-window attention is correct, and what each way costs."""

__version__ = "0.1.0"

import time as _time

# When this process took up swabench: a run records its start-up (imports, environment, peaks, JIT
# warm-up) from here, so a launch's wall time can be split into start-up, sweep and the rest.
STARTED = _time.perf_counter()
