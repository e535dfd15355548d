"""``python3 -m benchmarks.diagnosis``: see run.py."""

import sys

from benchmarks.diagnosis.run import main

sys.exit(main())
