"""``python -m cli ...`` runs the ``diarist`` command (what the installed ``diarist`` script runs)."""

import sys

from cli.main import main

sys.exit(main())
