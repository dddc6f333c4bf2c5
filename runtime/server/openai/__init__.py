"""OpenAI-style endpoints (``/v1/models``, ``/v1/chat/completions``, ``/v1/images/generations``,
``/v1/videos``) over workflow templates given with ``--openai-model``.

A request fills in its model's template (``templates``, ``requests``, ``loras``) and is queued like
``POST /prompt`` through ComfyUI's own prompt service (``jobs``), so it shares the queue, the history and the
worker; ``results`` and ``errors`` shape the answers the way OpenAI's clients expect. ``routes`` and
``video_routes`` register the endpoints.

Only relative imports reach this package: its name is the same as the ``openai`` client on PyPI, which an
absolute ``import openai`` (in the tests, say) still finds.
"""
