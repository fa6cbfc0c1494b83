"""Every ``python -m lightning_bpd <command>``, one module each (:mod:`lightning_bpd.commands.cli` dispatches):
``fit`` / ``validate`` / ``test`` (:mod:`~lightning_bpd.commands.cli`, LightningCLI), ``decode``, ``bench``,
``bench-generate``, ``distill``, ``human-eval``, ``make-base``, ``export-base``, ``export-heads``, ``recipe`` and
``results``. The libraries they share (timing, peers, evaluation, the runtime) live below them, never here."""
