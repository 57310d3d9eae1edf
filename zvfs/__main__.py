import sys

from zvfs.entry import main

sys.exit(main())
