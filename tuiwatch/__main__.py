import sys

from tuiwatch.cli.main import main

sys.exit(main())
