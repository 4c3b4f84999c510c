"""`python -m attngen ...` is the `attngen` command."""

import sys

from .cli import main

sys.exit(main())
