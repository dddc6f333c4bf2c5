"""Headless runtime: graph executor, workflow conversion, model registry, HTTP/WebSocket server, CLI.

Importing it installs the runtime as the nodes' headless host (``usecases.host``): its model registry and its
execution context, and the built-in tiny models it offers (``tiny_models``). The nodes never import the runtime
(it imports them to run them).
"""

from ..usecases import host as _host
from . import context as _context
from . import folder_paths as _folder_paths

_host.install(folder_paths=_folder_paths, current_context=_context.current_context)


def _tiny_models():
    # lazy: the factory imports torch; the CLI's fast start imports this package (``tests/test_package_layout``)
    from .. import tiny_models

    return tiny_models


_host.install_builtin_models(_tiny_models)
