import sys

from mavjet.ops.cli import main

sys.exit(main())
