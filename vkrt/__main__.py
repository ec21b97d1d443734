"""`python -m vkrt` is the `vkrt` command."""
import sys

from vkrt.cli import main

sys.exit(main())
