"""The composition root: the ``diarist`` command (:mod:`cli.main`) and its subcommands (:mod:`cli.commands`).

It is the one package that puts the others together (settings, the API, the workers, the engine, the
transcription pipeline); nothing else imports it (``scripts/check_imports.py``).
"""
