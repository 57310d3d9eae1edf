import sys

from zvfs.cli import main

sys.exit(main())
