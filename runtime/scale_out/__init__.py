"""``lorabind serve --ray``: the same ComfyUI-compatible API in front of a pool of Ray Serve replicas.

Why Ray Serve and not our own pool: its *model multiplexing* already routes a request that carries a model id
to a replica that has that id loaded, with an LRU per replica. For lorabind the "model id" is a *binding
fingerprint* (the model plus the LoRAs fused into it and their strengths, ``fingerprint.py``), so a prompt
lands where its weights are already fused and no replica re-fuses a 14B expert that another replica could
serve as it is.

Split by concern: ``fingerprint`` (what a prompt needs bound), ``replica`` (the Ray Serve deployment: one
executor per GPU), ``interrupts`` (the one actor that carries ``/interrupt`` to whichever replica runs a
prompt), ``outputs`` (files written on a replica brought into the front's output folder), ``dispatch`` (the
front's executor: validated prompt -> replica -> events back in order), ``cluster`` (connect or start Ray and
deploy), ``prompt_run`` (one prompt on a replica's or a rank's executor). With ``--parallel`` a replica is a group
of rank actors splitting one model: ``rank_group`` (placement, rendezvous, settling each prompt over the ranks)
and ``rank_actor`` (one rank). Ray is imported only here, and this package only with ``--ray``.
"""
