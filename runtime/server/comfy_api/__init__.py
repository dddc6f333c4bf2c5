"""ComfyUI's HTTP API as its frontend and clients call it: ``/prompt``, ``/queue``, ``/history``, ``/view``,
``/upload``, ``/object_info``, the editor's user data, settings, jobs and logs panels, and the frontend itself.

Each ``routes_*`` module registers one group of endpoints; the services beside them hold what is not HTTP
(``prompt_service``: validating a prompt before it is queued, which the OpenAI endpoints reuse; ``user_files``;
``template_thumbnails``). They build on the plumbing one folder up and import nothing of ``openai/``.
"""
