"""`python -m ember` is the `ember` command.

imports: cli
"""

import sys

from ember.cli import main

sys.exit(main())
