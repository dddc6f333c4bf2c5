"""``python -m lorabind ...``: the ``lorabind`` command, for launchers that start a module (``torchrun -m``).

ComfyUI imports the pack by its ``__init__.py`` alone, so this file is never run inside ComfyUI.
"""

import sys

from .runtime.cli import main

sys.exit(main())
