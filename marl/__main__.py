import sys

from marl.app.cli import main

sys.exit(main())
