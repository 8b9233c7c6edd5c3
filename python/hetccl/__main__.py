"""`python -m hetccl` is the `hetccl` command."""

import sys

from .cli import main

sys.exit(main())
