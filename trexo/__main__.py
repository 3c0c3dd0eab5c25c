"""`python -m trexo` is the `trexo` command."""

import sys

from trexo.cli import main

sys.exit(main())
